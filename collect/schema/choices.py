"""Each choice of the schema listed once: sweeps, features and the search space take these."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

Family = Literal["gpt", "llama", "moe"]
Sharding = Literal["none", "zero1", "fsdp_grad_op", "fsdp_full"]
Recompute = Literal["none", "selective", "full"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b"]
DType = Literal["float32", "bfloat16", "float16"]
Float8 = Literal["none", "tensorwise", "rowwise"]
Framework = Literal["torch", "megatron", "nanotron", "torchtitan"]
FAMILIES: tuple[str, ...] = get_args(Family)
SHARDINGS: tuple[str, ...] = get_args(Sharding)
RECOMPUTES: tuple[str, ...] = get_args(Recompute)
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)
FLOAT8_SCALINGS: tuple[str, ...] = get_args(Float8)
FRAMEWORKS: tuple[str, ...] = get_args(Framework)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def framework_conventions(framework: str, tp: int) -> dict[str, bool]:
    """The plan's convention fields (collect.schema.plan) as a framework sets them by default. torch: the local
    collector's (whole logits on every tp rank, the pipeline keeps its outputs). Megatron (and NeMo, which runs it)
    and Nanotron: vocabulary-parallel cross entropy, and only the loss kept by the pipeline. torchtitan: its loss
    parallelism (on unless disabled, with tp) and torch's pipeline schedule, which keeps the outputs."""
    sharded_loss = tp > 1 and framework != "torch"
    return {"loss_parallel": sharded_loss, "pipeline_keeps_outputs": framework in ("torch", "torchtitan")}


class Strict(BaseModel):
    # Unknown fields are typos more often than not: reject them by name.
    model_config = ConfigDict(extra="forbid", frozen=True)
