"""A rank's end of iteration as table rows: DDP's gradient all-reduce, FSDP's deferred reduce-scatter under a
pipeline, the optimizer, and ZeRO-1's parameter all-gather."""

from __future__ import annotations

import numpy as np

from gnn.costs.analytic import dtype_bytes, grad_dtype_bytes, largest_param
from gnn.costs.pricing import Pricing
from gnn.graph.memory import StageMemory
from gnn.graph.template import PassRows, PassTemplate

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb


def compile_step(memory: StageMemory, pricing: Pricing, dp_cross: bool, stages: tuple[int, ...]) -> PassTemplate:
    """The rows of a rank's end of iteration on the stages it holds (gnn.graph.passes.PassCompiler.step says what
    they depend on). ``dp_cross``: the data-parallel group spans nodes."""
    plan, w = memory.plan, memory.w
    rows, last = PassRows(pricing), None
    params = sum(memory.params(s) for s in stages)
    if plan.data_ranks > 1 and not plan.fsdp_enabled:
        grads = params * grad_dtype_bytes(w, plan)
        buckets = max(1, int(np.ceil(grads / DDP_BUCKET_BYTES)))
        last = rows.add(
            last,
            "dp_comm",
            "backward",
            stages[0],
            count=buckets,
            message_bytes=grads / buckets,
            group=plan.data_ranks,
            crosses_node=dp_cross,
        )
    if memory.pipelined_fsdp():
        # one reduce-scatter of the stages' accumulated gradients, unit by unit: a unit's input copy and its
        # shard live beside the unsharded gradients
        unit = max(memory.unit_bytes(s) for s in stages)
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
            transient_bytes=unit * (1 + 1 / plan.data_ranks),
        )
    shard = plan.data_ranks if plan.sharding != "none" else 1
    # AdamW reads and writes parameter, gradient and both moments: ~16 bytes and ~10 flops per parameter. On
    # CPU it updates one tensor at a time (no foreach kernels), with two temporaries the size of that tensor:
    # the largest tensor sets the peak (measured: 2.1 MB over the states for a 1.05 MB MLP weight).
    last = step = rows.add(
        last,
        "optimizer",
        "step",
        stages[0],
        flops=10 * params / shard,
        transient_bytes=2 * largest_param(w, plan, stages) * dtype_bytes(w),
        seconds=pricing.optimizer_seconds(stages, params / shard),
    )
    if plan.sharding == "zero1" and plan.data_ranks > 1:
        rows.add(
            step,
            "zero_allgather",
            "step",
            stages[0],
            message_bytes=params * dtype_bytes(w) / plan.data_ranks,
            group=plan.data_ranks,
            crosses_node=dp_cross,
        )
    return rows.done(last)
