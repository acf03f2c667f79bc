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
FAMILIES: tuple[str, ...] = get_args(Family)
SHARDINGS: tuple[str, ...] = get_args(Sharding)
RECOMPUTES: tuple[str, ...] = get_args(Recompute)
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)
FLOAT8_SCALINGS: tuple[str, ...] = get_args(Float8)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class Strict(BaseModel):
    # Unknown fields are typos more often than not: reject them by name.
    model_config = ConfigDict(extra="forbid", frozen=True)
