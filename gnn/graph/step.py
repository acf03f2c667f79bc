"""A rank's end of iteration as table rows: DDP's gradient all-reduce, FSDP's deferred reduce-scatter under a
pipeline, the optimizer, and ZeRO-1's parameter all-gather.

Where the framework overlaps them (plan.grad_reduce_overlap, plan.param_gather_overlap: Megatron's
overlap_grad_reduce and overlap_param_gather), a collective's buckets run under compute: the gradients' while the
last micro-batch's backward still runs, the parameters' under the next step's first forward. Its node then costs
what that compute cannot hide, and never less than one bucket (the last gradients are ready only when the backward
ends; the first layer's parameters are needed first). The node keeps its count and bytes, so its features say
how much traffic it moved.
"""

from __future__ import annotations

import numpy as np

from gnn.costs.analytic import dtype_bytes, grad_dtype_bytes, largest_param, moment_bytes, steps_one_by_one
from gnn.costs.pricing import Pricing
from gnn.graph.memory import StageMemory
from gnn.graph.table import COL, table_row
from gnn.graph.template import PassRows, PassTemplate, led_by

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb
# Megatron's buckets where it overlaps: bucket_cap_mb 125 in NeMo's recipes (NVIDIA/NeMo-Framework-Launcher
# launcher_scripts/conf/training/llama/llama3_70b.yaml: mcore_distributed_optim, overlap_grad_sync and
# overlap_param_sync true)
OVERLAP_BUCKET_BYTES = 125 * 2**20


def compile_step(
    memory: StageMemory,
    pricing: Pricing,
    dp_cross: bool,
    stages: tuple[int, ...],
    windows: tuple[float, float],
    foreach: bool = False,
) -> PassTemplate:
    """The rows of a rank's end of iteration on the stages it holds (gnn.graph.passes.PassCompiler.step says what
    they depend on). ``dp_cross``: the data-parallel group spans nodes. ``windows``: seconds of compute in one
    micro-batch's backward and forward of those stages, what an overlapped collective can hide under. ``foreach``:
    AdamW runs torch's foreach kernels (its default on CUDA), not a loop over the parameters (on a CPU), unless the
    plan's parameters mix DTensors and plain tensors (gnn.costs.analytic.steps_one_by_one)."""
    plan, w = memory.plan, memory.w
    foreach = foreach and not steps_one_by_one(w, plan)
    rows, last = PassRows(pricing), None
    params = sum(memory.params(s) for s in stages)
    if plan.data_ranks > 1 and not plan.fsdp_enabled:
        grads = params * grad_dtype_bytes(w, plan)
        bucket = OVERLAP_BUCKET_BYTES if plan.grad_reduce_overlap else DDP_BUCKET_BYTES
        buckets = max(1, int(np.ceil(grads / bucket)))
        fields = dict(count=buckets, message_bytes=grads / buckets, group=plan.data_ranks, crosses_node=dp_cross)
        seconds = exposed(pricing, "dp_comm", fields, windows[0]) if plan.grad_reduce_overlap else None
        last = rows.add(last, "dp_comm", "backward", stages[0], seconds=seconds, **fields)
    if memory.pipelined_fsdp():
        # one reduce-scatter of the stages' accumulated gradients, unit by unit: a unit's input copy and its
        # shard live beside the unsharded gradients and the weights still gathered
        unit = max(max(memory.unit_bytes(s), memory.root_bytes(s)) for s in stages)
        units = sum(memory.fsdp_units(s) for s in stages)
        last = rows.add(
            last,
            "fsdp_reducescatter",
            "backward",
            stages[0],
            count=units,
            message_bytes=params * grad_dtype_bytes(w, plan) / units,
            group=plan.data_ranks,
            crosses_node=dp_cross,
            transient_bytes=unit * (1 + 1 / plan.data_ranks) + memory.gathered_at_reduce(stages),
        )
    shard = plan.data_ranks if plan.sharding != "none" else 1
    # AdamW reads and writes parameter, gradient and both moments: ~16 bytes and ~10 flops per parameter. On
    # CPU it updates one tensor at a time (no foreach kernels), with two temporaries the size of that tensor:
    # the largest tensor sets the peak (measured: 2.1 MB over the states for a 1.05 MB MLP weight). Its foreach
    # kernels (CUDA's default) take the square root of every second moment at once: one more moment of every
    # parameter stepped (collect.fake.kernels; the H100 rows of data/memory).
    if foreach:
        temporaries = sum(memory.stepped_params(s) for s in stages) * moment_bytes(w, plan)
    else:
        temporaries = 2 * largest_param(w, plan, stages) * dtype_bytes(w)
    last = step = rows.add(
        last,
        "optimizer",
        "step",
        stages[0],
        flops=10 * params / shard,
        transient_bytes=temporaries,
        seconds=pricing.optimizer_seconds(stages, params / shard),
    )
    if plan.sharding == "zero1" and plan.data_ranks > 1:
        shard = params * dtype_bytes(w) / plan.data_ranks
        buckets = (
            max(1, int(np.ceil(shard * plan.data_ranks / OVERLAP_BUCKET_BYTES))) if plan.param_gather_overlap else 1
        )
        fields = dict(count=buckets, message_bytes=shard / buckets, group=plan.data_ranks, crosses_node=dp_cross)
        seconds = exposed(pricing, "zero_allgather", fields, windows[1]) if plan.param_gather_overlap else None
        rows.add(step, "zero_allgather", "step", stages[0], seconds=seconds, **fields)
    return rows.done(last)


def overlap_windows(plan, stages: tuple[int, ...], template) -> tuple[float, float]:
    """Compute seconds of one micro-batch's backward and forward on the stages a rank holds (``template``:
    PassCompiler.template): what an overlapped gradient reduction or parameter gather hides under. Zero where
    nothing overlaps."""
    if not (plan.grad_reduce_overlap or plan.param_gather_overlap):
        return 0.0, 0.0
    compute = lambda table: float(table[table[:, COL["stream"]] == 0, COL["est_time"]].sum())  # noqa: E731
    backward = sum(compute(template("B", s, (False, False)).table) for s in stages)
    forward = sum(compute(template("F", s, (False,)).table) for s in stages)
    return backward, forward


def exposed(pricing: Pricing, kind: str, fields: dict, window: float) -> float:
    """Seconds of a bucketed collective that ``window`` seconds of compute cannot hide: at least one bucket."""
    whole = pricing.estimate(
        kind, "step", fields["count"], 0.0, fields["message_bytes"], fields["group"], fields["crosses_node"]
    )
    return max(whole / fields["count"], whole - window)


def with_schedule_end(step: PassTemplate, stage: int, sent: float, merged: float) -> PassTemplate:
    """A rank's end of iteration (its first stage ``stage``) led by its schedule's end: the sends waited there free
    the ``sent`` bytes they held (StageMemory.sent_bytes); then the last stage's rank merges its kept outputs
    (torch.cat of every micro-batch's, ``merged`` bytes, beside them: the trainer drops the merged copy before the
    optimizer runs). Neither is priced."""
    if merged:
        step = led_by(step, table_row("head", "step", 0, stage, 0, 1, 0.0, 0.0, 1, False, 0.0, 0.0, merged, 0.0))
    if sent:
        step = led_by(step, table_row("p2p", "step", 0, stage, 0, 1, 0.0, 0.0, 1, False, 0.0, sent, 0.0, 0.0))
    return step
