"""The plan schema: Workload, Plan, Cluster and the RunSpec that binds them.

Each model checks its own fields; RunSpec does every cross-field check in one
place (like torchtitan's ``ParallelDims._validate``) and its messages show the
arithmetic. Anything RunSpec accepts must really run under collect/; anything
that cannot run is rejected here with the reason.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

Sharding = Literal["none", "zero1", "fsdp_grad_op", "fsdp_full"]
Recompute = Literal["none", "selective", "full"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b"]
DType = Literal["float32", "bfloat16", "float16"]
# each choice listed once, here: sweeps, features and the search space take these
SHARDINGS: tuple[str, ...] = get_args(Sharding)
RECOMPUTES: tuple[str, ...] = get_args(Recompute)
PIPELINE_SCHEDULES: tuple[str, ...] = get_args(PipelineSchedule)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class _Strict(BaseModel):
    # Unknown fields are typos more often than not: reject them by name.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Workload(_Strict):
    """A GPT model and its batch."""

    family: Literal["gpt"] = "gpt"
    """Model family; other families (MoE, recommendation) will join this union."""
    layers: int = Field(ge=1)
    """Number of transformer blocks."""
    hidden: int = Field(ge=1)
    """Model width d."""
    heads: int = Field(ge=1)
    """Attention heads; hidden must divide by heads."""
    seq_len: int = Field(ge=1)
    """Tokens per sample."""
    vocab: int = Field(ge=2)
    """Vocabulary size."""
    micro_batch_size: int = Field(ge=1)
    """Samples per micro-batch on one data-parallel replica."""
    global_batch_size: int = Field(ge=1)
    """Samples per optimizer step over all replicas and micro-batches."""
    dtype: DType = "float32"
    """Parameter and activation dtype."""

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "Workload":
        if self.hidden % self.heads:
            raise ValueError(
                f"hidden ({self.hidden}) must be divisible by heads ({self.heads}): "
                f"{self.hidden} % {self.heads} = {self.hidden % self.heads}"
            )
        return self

    @property
    def num_params(self) -> int:
        """Exact parameter count of collect.workloads.gpt.GPT (untied head)."""
        d, v = self.hidden, self.vocab
        per_block = 12 * d * d + 13 * d  # qkv+proj+mlp weights and biases, two norms
        return self.layers * per_block + 2 * v * d + self.seq_len * d + 2 * d


class Plan(_Strict):
    """How a workload is parallelised."""

    dp: int = Field(default=1, ge=1)
    """Data-parallel degree."""
    tp: int = Field(default=1, ge=1)
    """Tensor-parallel degree (Megatron column/row split of attention and MLP)."""
    pp: int = Field(default=1, ge=1)
    """Pipeline-parallel degree (number of ranks in a pipeline)."""
    sharding: Sharding = "none"
    """How data-parallel replicas hold state: DDP, ZeRO-1 optimizer sharding,
    FSDP2 without reshard after forward (ZeRO-2-like), or full FSDP (ZeRO-3)."""
    recompute: Recompute = "none"
    """Activation checkpointing per block: none, selective (save matmul outputs
    only), or full."""
    pp_schedule: PipelineSchedule | None = None
    """Pipeline schedule; required when pp > 1 (defaults to 1f1b), None when pp = 1."""
    virtual_stages: int = Field(default=1, ge=1)
    """Model chunks per pipeline rank; > 1 only with interleaved_1f1b."""
    num_microbatches: int = Field(default=1, ge=1)
    """Micro-batches per optimizer step (pipeline depth or gradient accumulation)."""
    sequence_parallel: bool = False
    """Shard norms and residual activations along the sequence over the tp axis."""

    @model_validator(mode="before")
    @classmethod
    def _default_schedule(cls, data):
        # before field validation: pp may be anything here, and a bad one is the field check's to report
        pp = data.get("pp", 1) if isinstance(data, dict) else None
        pp = int(pp) if isinstance(pp, str) and pp.strip().isdigit() and len(pp) < 10 else pp
        if isinstance(pp, int) and pp > 1 and data.get("pp_schedule") is None:
            data = {**data, "pp_schedule": "1f1b"}
        return data

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def num_stages(self) -> int:
        return self.pp * self.virtual_stages

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def fsdp_enabled(self) -> bool:
        """Parameters are wrapped by FSDP2 (fsdp_grad_op or fsdp_full); its hooks run even at dp = 1."""
        return self.sharding in ("fsdp_grad_op", "fsdp_full")

    @property
    def reshard_after_forward(self) -> bool:
        """FSDP frees each block's gathered parameters after its forward and gathers them again for the
        backward (fsdp_full, ZeRO-3); fsdp_grad_op keeps them (ZeRO-2-like)."""
        return self.sharding == "fsdp_full"

    @property
    def interleaved(self) -> bool:
        return self.pp_schedule == "interleaved_1f1b"


class Cluster(_Strict):
    """Where the plan runs."""

    nodes: int = Field(default=1, ge=1)
    """Number of machines."""
    devices_per_node: int = Field(ge=1)
    """Ranks per machine (GPUs, or CPU processes here)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Torch device type of every rank."""
    device_kind: str = "cpu"
    """What the device is (e.g. cpu, a100-80gb); names a hardware preset where one exists."""
    memory_bytes: int = Field(ge=1)
    """Per-device memory capacity; a plan whose peak exceeds it is labelled oom."""
    backend: Literal["gloo", "nccl"] = "gloo"
    """torch.distributed backend."""

    @model_validator(mode="after")
    def _backend_matches_device(self) -> "Cluster":
        if self.backend == "nccl" and self.device != "cuda":
            raise ValueError(f"backend 'nccl' needs device 'cuda', got device {self.device!r}")
        return self

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node


class RunSpec(_Strict):
    """One (workload, plan, cluster) point: the unit that is measured and predicted."""

    workload: Workload
    plan: Plan
    cluster: Cluster

    @model_validator(mode="after")
    def _validate(self) -> "RunSpec":
        problems = plan_problems(self.workload, self.plan, self.cluster)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def run_id(self) -> str:
        """Stable content hash: identical specs get identical ids on any machine."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def plan_problems(w: Workload, p: Plan, c: Cluster) -> list[str]:
    """Every reason this combination cannot run, each naming fields and arithmetic."""
    problems = []
    if p.world_size != c.world_size:
        problems.append(
            f"plan.dp ({p.dp}) * plan.tp ({p.tp}) * plan.pp ({p.pp}) = {p.world_size} != "
            f"cluster world size nodes ({c.nodes}) * devices_per_node ({c.devices_per_node}) = {c.world_size}"
        )
    problems += _tp_problems(w, p)
    problems += _pp_problems(w, p)
    samples = p.dp * w.micro_batch_size * p.num_microbatches
    if samples != w.global_batch_size:
        problems.append(
            f"workload.global_batch_size ({w.global_batch_size}) != plan.dp ({p.dp}) * "
            f"workload.micro_batch_size ({w.micro_batch_size}) * plan.num_microbatches "
            f"({p.num_microbatches}) = {samples}"
        )
    if w.dtype == "float16" and c.device == "cpu":
        problems.append("workload.dtype 'float16' is not supported for training on device 'cpu'; use bfloat16")
    return problems


def _tp_problems(w: Workload, p: Plan) -> list[str]:
    problems = []
    for name, value in (("heads", w.heads), ("hidden", w.hidden), ("vocab", w.vocab)):
        if value % p.tp:
            problems.append(
                f"workload.{name} ({value}) must be divisible by plan.tp ({p.tp}): {value} % {p.tp} = {value % p.tp}"
            )
    if p.sequence_parallel and not p.tp_enabled:
        problems.append("plan.sequence_parallel needs plan.tp > 1")
    if p.sequence_parallel and w.seq_len % p.tp:
        problems.append(f"workload.seq_len ({w.seq_len}) must be divisible by plan.tp ({p.tp}) with sequence_parallel")
    if p.sharding == "none" and p.tp_enabled and p.dp_enabled:
        # DDP flattens gradients into plain buckets and cannot hold DTensor parameters
        # (torchtitan refuses the same combination); FSDP2 composes with TP.
        problems.append(
            "plan.sharding 'none' (DDP) cannot be combined with plan.tp > 1 and plan.dp > 1 "
            "(DDP does not support DTensor parameters); use fsdp_grad_op for dp x tp"
        )
    if p.sharding == "zero1" and p.tp_enabled:
        # ZeroRedundancyOptimizer partitions and broadcasts plain tensors; it cannot
        # hold DTensor parameters, so ZeRO-1 composes with dp and pp only.
        problems.append(
            "plan.sharding 'zero1' cannot be combined with plan.tp > 1 "
            "(ZeroRedundancyOptimizer does not support DTensor parameters); use fsdp_grad_op"
        )
    return problems


def _pp_problems(w: Workload, p: Plan) -> list[str]:
    problems = []
    if not p.pp_enabled:
        if p.pp_schedule is not None:
            problems.append(f"plan.pp_schedule ({p.pp_schedule!r}) needs plan.pp > 1; leave it unset when pp = 1")
        if p.virtual_stages != 1:
            problems.append(f"plan.virtual_stages ({p.virtual_stages}) needs plan.pp > 1")
        return problems
    interleaved = p.interleaved
    if interleaved and p.virtual_stages < 2:
        problems.append(f"plan.pp_schedule 'interleaved_1f1b' needs plan.virtual_stages >= 2, got {p.virtual_stages}")
    if not interleaved and p.virtual_stages != 1:
        problems.append(f"plan.virtual_stages ({p.virtual_stages}) > 1 needs pp_schedule 'interleaved_1f1b'")
    if w.layers % p.num_stages:
        problems.append(
            f"workload.layers ({w.layers}) must be divisible by plan.pp ({p.pp}) * plan.virtual_stages "
            f"({p.virtual_stages}) = {p.num_stages}: {w.layers} % {p.num_stages} = {w.layers % p.num_stages}"
        )
    if p.pp_schedule == "1f1b" and p.num_microbatches < p.pp:
        problems.append(
            f"plan.pp_schedule '1f1b' needs plan.num_microbatches ({p.num_microbatches}) >= plan.pp ({p.pp})"
        )
    if interleaved and p.num_microbatches % p.pp:
        problems.append(
            f"plan.pp_schedule 'interleaved_1f1b' needs plan.num_microbatches ({p.num_microbatches}) "
            f"divisible by plan.pp ({p.pp}): {p.num_microbatches} % {p.pp} = {p.num_microbatches % p.pp}"
        )
    return problems
