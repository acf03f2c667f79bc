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
AttentionKernel = Literal["sdpa", "flash2", "cudnn"]
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
    "grad_accumulation_pass",
    "float8_params",
    "pipeline_split",
    "attention",
    "attention_keeps_packed_qkv",
    "attention_kernel",
    "tp_layer_latency",
    "grad_reduce_overlap",
    "param_gather_overlap",
    "tp_comm_overlap",
    "optimizer_state_dtype",
    "moe_dispatcher",
)


# Each framework's conventions side by side (the Plan fields of the same names say what each means): a row's
# value holds where its condition does (tp: tp > 1; sp: sequence parallelism; half: a 2-byte dtype; fp8: an FP8
# format Megatron holds the weights in alone, tensorwise or MXFP8), and is False elsewhere. torch is the collector.
TABLE_FRAMEWORKS = ("torch", "torchtitan", "megatron", "nemo", "nanotron")
CONVENTION_TABLE: dict[str, tuple[tuple[str, ...], tuple]] = {
    # convention                   condition      torch     torchtitan megatron  nemo      nanotron
    "loss_parallel":              (("tp",),       (False,   True,      True,     True,     True)),
    "pipeline_keeps_outputs":     ((),            (True,    True,      False,    False,    False)),
    "pipeline_holds_buffers":     ((),            (True,    True,      False,    False,    False)),
    "sequence_parallel_regather": (("sp",),       (False,   False,     True,     True,     True)),
    "fp32_master_weights":        (("half",),     (False,   True,      True,     True,     True)),
    "fp32_grads":                 (("half",),     (False,   True,      True,     True,     True)),
    "grad_accumulation_pass":     (("half",),     (False,   False,     False,    False,    True)),
    "float8_params":              (("half", "fp8"), (False, False,     True,     True,     False)),
    "pipeline_split":             ((),            ("layers", "layers", "layers", "layers", "weights")),
    "attention_keeps_packed_qkv": ((),            (False,   False,     False,    False,    True)),
    "attention_kernel":           ((),            ("sdpa",  "sdpa",    "cudnn",  "cudnn",  "flash2")),
    "tp_layer_latency":           ((),            (False,   False,     False,    False,    True)),
    "grad_reduce_overlap":        ((),            (False,   False,     True,     True,     False)),
    "param_gather_overlap":       ((),            (False,   False,     True,     True,     False)),
    "tp_comm_overlap":            (("tp", "sp"),  (False,   False,     False,    True,     False)),
}  # fmt: skip


def framework_conventions(
    framework: str, tp: int, sequence_parallel: bool = False, dtype: str = "float32", float8: str = "none"
) -> dict[str, bool | str]:
    """The plan's convention fields (collect.schema.plan) as a framework sets them by default: its column of
    CONVENTION_TABLE where each row's condition holds.

    Sources: torch is the local collector's code. Megatron: vocab-parallel cross entropy, forward_backward_func
    keeping only the loss, point-to-point buffers freed once used, sequence parallelism's all-gather repeated in
    backward, fp32 master weights and main_grad buffers (its arguments turn fp32 gradient accumulation on for bf16
    only, so its fp16 gradients stay fp16), overlap_grad_reduce and overlap_param_gather (on in NeMo's and
    Megatron-Bridge's performance recipes; Megatron-LM's releases before 2023 had neither, so older runs turn them
    off, collect.published.dlperf), and fp8_param_gather in Megatron-Bridge's FP8 delayed/current-scaling and MXFP8
    recipes. NeMo (and Megatron-Bridge) run Megatron and overlap tensor parallelism's collectives with the GEMMs
    where sequence parallelism runs (tp_comm_overlap). Nanotron: the same as Megatron without the overlaps, and
    alone it splits a pipeline by weights, keeps multi-head attention's packed q, k and v whole, and waits a
    latency per layer that grows with tp (measured in the Ultra-Scale Playbook's runs), and runs FlashAttention-2
    (flash_attn_varlen_func) where Megatron and NeMo run Transformer Engine's cuDNN fused attention, and adds each
    micro-batch's gradients into its fp32 buffers in a pass of its own (FP32GradientAccumulator.backward).
    torchtitan: loss parallelism (on unless disabled, with tp), torch's pipeline schedule and DTensor's sequence
    parallelism, FSDP2's mixed precision (fp32 sharded parameters, fp32 gradient reduction). Every framework runs fused
    attention (plan.attention, the default)."""
    column = TABLE_FRAMEWORKS.index(framework)
    holds = {
        "tp": tp > 1,
        "sp": sequence_parallel,
        "half": DTYPE_BYTES.get(dtype, 4) == 2,
        "fp8": float8 in ("tensorwise", "mxfp8"),
    }
    conventions = {
        name: values[column] if all(holds[c] for c in condition) else False
        for name, (condition, values) in CONVENTION_TABLE.items()
    }
    if framework in ("megatron", "nemo") and dtype == "float16":
        conventions["fp32_grads"] = False  # Megatron accumulates fp16 gradients in fp16 (bf16 only is forced)
    return conventions


class Strict(BaseModel):
    # Unknown fields are typos more often than not: reject them by name.
    model_config = ConfigDict(extra="forbid", frozen=True)
