"""A deep stack's peak from three shallow traces: each segment of the run extrapolated along its own line.

The blocks of a stack are alike, so whatever is live while block j of an n-block chunk runs is affine in n and j:
weights, gradients and optimizer states grow with n, saved activations with j on the way down and with n - j on the
way back. A trace's run is cut into segments at each block's forward (``forward``, recompute included) and at the
start of its backward (``backward``: its output's gradient arrives), and each segment's peak is kept under its
label (collect.fake.counter.LiveBytes.mark). Blocks near the ends of a chunk neighbour the embedding, the head and
the optimizer step, so the first HEAD (after a MoE model's dense layers) and the last HEAD MoE periods are labelled
by their position; the blocks between are labelled by their place in the MoE period and pooled, their pool's peak
being that of one end of the run (an affine function of j is largest at an end). Every label's peak is then affine in
the depth: traced at three depths, each label's line through the first two must meet the third, and the deep
stack's peak is the largest of the lines at its depth. The whole peak alone is not affine (which segment holds it
can change with depth), the segments' are. tests/collect/fake/test_depth.py checks the extrapolation against whole
traces for every strategy.
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial

from torch import nn

from collect.parallel.pp import stage_ids
from collect.schema import RunSpec

HEAD = 1  # blocks (MoE periods at the end) at each end of a chunk labelled by their position
# What a line may miss its third depth by. Counting is exact and most segments are on their lines to the byte, but
# ZeRO-1 hands whole parameters to ranks by a greedy split whose share moves by a few hundred bytes with the depth.
SLACK = 1e-3


class DepthMismatch(ValueError):
    """A segment's peaks over the three depths are not on a line: the stack is not traced alike at every depth."""


def sampled_depths(spec: RunSpec, pp_rank: int) -> tuple[int, int, int] | None:
    """Three depths (blocks per pipeline chunk) whose traces give this rank's peak, or None to trace it whole: a
    stack not deeper than them, chunks of unequal depth on one rank, a split by weights, or a MoE period that a
    pipeline split could cut differently at each depth."""
    w, plan = spec.workload, spec.plan
    period = w.moe_every if w.family == "moe" else 1
    dense = w.first_dense_layers if w.family == "moe" else 0
    if plan.pipeline_split == "weights" or (plan.pp_enabled and period > 1):
        return None
    counts = plan.stage_layers(w.layers, w.pipeline_costs)
    targets = {counts[s] for s in stage_ids(plan, pp_rank)}
    if len(targets) != 1 or (plan.pp_enabled and dense > counts[0]):
        return None
    (target,) = targets
    ends = dense + HEAD + HEAD * period
    depths = tuple(ends + period * m for m in (1, 2, 3))
    return tuple(map(int, depths)) if target > depths[-1] and (target - ends) % period == 0 else None


def target_depth(spec: RunSpec, pp_rank: int) -> int:
    """The blocks each of this rank's chunks holds (sampled_depths made sure they are equal)."""
    counts = spec.plan.stage_layers(spec.workload.layers, spec.workload.pipeline_costs)
    return counts[stage_ids(spec.plan, pp_rank)[0]]


def with_depth(spec: RunSpec, depth: int) -> RunSpec:
    """The plan with ``depth`` blocks in every pipeline chunk."""
    layers = spec.plan.num_stages * depth
    return spec.model_copy(update={"workload": spec.workload.model_copy(update={"layers": layers})})


def mark_blocks(modules: list[nn.Module], live) -> None:
    """Marks each block's forward and the start of its backward on ``live`` (a LiveBytes), labelled (kind, chunk,
    block, blocks in the chunk)."""
    for chunk, module in enumerate(modules):
        while not hasattr(module, "layers"):  # DDP's wrapper
            module = module.module
        blocks = list(module.layers.values())
        for j, block in enumerate(blocks):
            label = (chunk, j, len(blocks))
            block.register_forward_pre_hook(partial(_forward, live, label))
            block.register_forward_hook(partial(_backward_ahead, live, label))


def mark_optimizer(optimizer, live) -> None:
    """Marks the optimizer's step and its end: its states and temporaries grow with the depth at their own rate."""
    step = optimizer.step

    def marked(*args, **kwargs):
        live.mark(("optimizer",))
        out = step(*args, **kwargs)
        live.mark(("optimizer done",))
        return out

    optimizer.step = marked


def _forward(live, label, module, args) -> None:
    live.mark(("forward", *label))


def _backward_ahead(live, label, module, args, output) -> None:
    if getattr(output, "requires_grad", False):
        output.register_hook(lambda grad: live.mark(("backward", *label)))


def extrapolate(spec: RunSpec, traced: dict[int, list[list]], depth: int) -> tuple[int, float]:
    """The peak at ``depth`` from each label's line through the traces' segments ({depth: [[*label, occurrence,
    bytes], ...]}), and the most any line missed its third depth by (a fraction of that segment's peak); or
    DepthMismatch naming the first label off its line by more than SLACK."""
    (d1, d2, d3), lines = sorted(traced), defaultdict(dict)
    for d, segments in traced.items():
        for *label, peak in segments:
            key = _pooled(spec, label)
            lines[key][d] = max(lines[key].get(d, 0), peak)
    peak, worst = 0, 0.0
    for key, peaks in lines.items():
        if len(peaks) != 3:
            raise DepthMismatch(f"segment {key} is traced at depths {sorted(peaks)} of {d1}, {d2}, {d3}")
        slope = (peaks[d2] - peaks[d1]) / (d2 - d1)
        miss = abs(peaks[d1] + slope * (d3 - d1) - peaks[d3]) / max(peaks[d3], 1)
        if miss > SLACK:
            raise DepthMismatch(f"segment {key} peaks {[peaks[d] for d in (d1, d2, d3)]} bytes at depths {d1}-{d3}")
        peak, worst = max(peak, round(peaks[d1] + slope * (depth - d1))), max(worst, miss)
    return peak, worst


def _pooled(spec: RunSpec, label: list) -> tuple:
    """A segment's label with its block's position made depth-free: its index from the nearer end, or (between
    the ends) its place in the MoE period."""
    if label[0] in ("start", "step", "optimizer", "optimizer done"):
        return tuple(label)
    kind, chunk, j, n, occurrence = label
    w = spec.workload
    period = w.moe_every if w.family == "moe" else 1
    first = (w.first_dense_layers if w.family == "moe" else 0) + HEAD
    if j < first:
        position = f"first {j}"
    elif j >= n - HEAD * period:
        position = f"last {n - j}"
    else:
        position = f"period {(j - first) % period}"
    return kind, chunk, position, occurrence
