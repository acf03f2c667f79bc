"""Each choice of the schema listed once: sweeps, features and the search space take these."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

Family = Literal["gpt", "llama", "moe"]
Sharding = Literal["none", "zero1", "fsdp_grad_op", "fsdp_full"]
Recompute = Literal["none", "selective", "full"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b"]
DType = Literal["float32", "bfloat16", "float16"]
Float8 = Literal["none", "tensorwise", "rowwise", "mxfp8", "nvfp4"]
OptimizerStateDType = Literal["float32", "bfloat16"]
Framework = Literal["torch", "megatron", "nemo", "nanotron", "torchtitan"]
PipelineSplit = Literal["layers", "weights"]
MoeDispatcher = Literal["alltoall", "hybrid"]
Attention = Literal["flash", "eager"]
FAMILIES: tuple[str, ...] = get_args(Family)
SHARDINGS: tuple[str, ...] = get_args(Sharding)
RECOMPUTES: tuple[str, ...] = get_args(Recompute)
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)
FLOAT8_SCALINGS: tuple[str, ...] = get_args(Float8)
# block-scaled formats (OCP microscaling, NVIDIA's NVFP4): Blackwell tensor cores only
BLOCK_SCALED: tuple[str, ...] = ("mxfp8", "nvfp4")


def gemm_rate_key(float8: str) -> str | None:
    """The hardware peak (a preset's peak_flops_per_s key) a workload.float8 setting's GEMMs run at: FP8's for
    tensorwise and rowwise scaling, a block-scaled format's own; None for none (the workload's dtype)."""
    if float8 == "none":
        return None
    return float8 if float8 in BLOCK_SCALED else "float8"


FRAMEWORKS: tuple[str, ...] = get_args(Framework)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# the fields that say how a framework runs a plan (Plan's conventions), not what the plan is
CONVENTIONS = (
    "loss_parallel",
    "pipeline_keeps_outputs",
    "pipeline_holds_buffers",
    "sequence_parallel_regather",
    "fp32_master_weights",
    "fp32_grads",
    "float8_params",
    "pipeline_split",
    "attention",
    "attention_keeps_packed_qkv",
    "tp_layer_latency",
    "grad_reduce_overlap",
    "param_gather_overlap",
    "tp_comm_overlap",
    "optimizer_state_dtype",
    "moe_dispatcher",
)


def framework_conventions(
    framework: str, tp: int, sequence_parallel: bool = False, dtype: str = "float32", float8: str = "none"
) -> dict[str, bool | str]:
    """The plan's convention fields (collect.schema.plan) as a framework sets them by default.

    torch: the local collector's (whole logits on every tp rank, the pipeline keeps its outputs and buffers,
    DTensor's sequence parallelism saves gathered inputs, weights and gradients in the workload's dtype).
    Megatron (and NeMo, which runs it) and Nanotron: vocabulary-parallel cross entropy, only the loss kept by the
    pipeline, whose buffers live only while used, sequence-parallel inputs gathered again in backward, and in a
    2-byte dtype fp32 master weights and gradients (Megatron's arguments turn on fp32 gradient accumulation for
    bf16 only, so its fp16 gradients stay fp16; Nanotron's benchmarks set accumulate_grad_in_fp32). torchtitan:
    loss parallelism (on unless disabled, with tp), torch's pipeline schedule and DTensor's sequence parallelism,
    FSDP2's mixed precision (fp32 sharded parameters, fp32 gradient reduction). Nanotron alone splits a pipeline by
    weights (plan.pipeline_split), keeps multi-head attention's packed q, k and v whole
    (plan.attention_keeps_packed_qkv) and waits a latency per layer that grows with tp (plan.tp_layer_latency).
    Megatron alone overlaps the gradient reduction with the backward and the distributed optimizer's parameter
    all-gather with the next forward (overlap_grad_reduce, overlap_param_gather: on in NeMo's and
    Megatron-Bridge's performance recipes; Megatron-LM's releases before 2023 had neither, so older runs turn them
    off, collect.published.dlperf). NeMo (and Megatron-Bridge) take Megatron's conventions and overlap tensor
    parallelism's collectives with the GEMMs where sequence parallelism runs (plan.tp_comm_overlap: the
    tp_comm_overlap of their performance recipes), and their FP8 recipes but sub-channel and NVFP4 hold the weights
    in FP8 only (plan.float8_params, for ``float8`` the workload's format). Every framework runs fused attention
    (plan.attention, the default)."""
    nemo = framework == "nemo"
    framework = "megatron" if nemo else framework
    torch = framework == "torch"
    half = DTYPE_BYTES.get(dtype, 4) == 2 and not torch
    return {
        "loss_parallel": tp > 1 and not torch,
        "pipeline_keeps_outputs": framework in ("torch", "torchtitan"),
        "pipeline_holds_buffers": framework in ("torch", "torchtitan"),
        "sequence_parallel_regather": sequence_parallel and framework in ("megatron", "nanotron"),
        "fp32_master_weights": half,
        # Megatron accumulates fp16 gradients in fp16 unless told otherwise (--accumulate-allreduce-grads-in-fp32
        # is off by default and forced on only for bf16)
        "fp32_grads": half and not (framework == "megatron" and dtype == "float16"),
        # Megatron-Bridge's and NeMo's FP8 recipes but sub-channel and NVFP4 hold the weights in FP8 only
        "float8_params": half and framework == "megatron" and float8 in ("tensorwise", "mxfp8"),
        "pipeline_split": "weights" if framework == "nanotron" else "layers",
        "attention_keeps_packed_qkv": framework == "nanotron",
        "tp_layer_latency": framework == "nanotron",
        "grad_reduce_overlap": framework == "megatron",
        "param_gather_overlap": framework == "megatron",
        "tp_comm_overlap": nemo and tp > 1 and sequence_parallel,
    }


class Strict(BaseModel):
    # Unknown fields are typos more often than not: reject them by name.
    model_config = ConfigDict(extra="forbid", frozen=True)
