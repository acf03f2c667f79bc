"""What verifying plans costs, estimated before any trace runs, and the budgets that bound it.

A plan is verified by tracing the first rank of each pipeline stage in a process of its own (collect.fake.sweep
.trace_point). A stage's trace costs about the same whatever the world size (FSDP makes only the chunks it reads)
and the depth (a deep stack is traced at three shallow depths), and grows with the micro-batches it runs (a plan of
many is traced at two counts, collect.fake.sweep.sampled_counts: pp + 1 and 2 pp + 1 for a pipeline), more steeply
for a mixture of experts (an operation per local expert); a pipeline's stage costs more again (its schedule's
sends, receives and buffers). STAGE_SECONDS is a line through the wall seconds per stage of the full-size sweeps in
data/fake against those micro-batches (fake-full-v1 and fake-full-nopp-v1, 303 plans of 8B-671B models on 8-16,384
ranks, two traced at once on this 2-core machine), by kind, times the 90th percentile of measured over fitted: an
upper bound for most plans, not a mean. The pipelined line rests on 13 plans only.
"""

from __future__ import annotations

from collect.fake.sweep import sampled_counts
from collect.schema import RunSpec

# kind -> (seconds, seconds per micro-batch traced) of a stage, and the p90 of measured over that line
STAGE_SECONDS = {"dense": (11.3, 3.4, 1.5), "moe": (15.3, 10.9, 1.9), "pipelined": (60.7, 1.9, 2.3)}
WALL_FACTOR = 3.0  # a plan's traces get this multiple of its estimate (at least MIN_PLAN_S) before they are stopped
MIN_PLAN_S = 60.0
HTTP_SECONDS = 300.0  # POST /verify: a few unpipelined plans, or one of a few stages
CLI_SECONDS = 3600.0  # python -m serve verify on one's own machine (--budget-s)
MAX_PLANS = 16  # plans one request may verify


class VerifyRefused(ValueError):
    """A verify request over its budget: the message gives the estimate and what to change."""


def plan_seconds(spec: RunSpec) -> float:
    """A plan's estimated wall seconds to trace: each stage's at STAGE_SECONDS, for the micro-batches it runs."""
    kind = "pipelined" if spec.plan.pp > 1 else "moe" if spec.workload.family == "moe" else "dense"
    base, per_microbatch, p90 = STAGE_SECONDS[kind]
    counts = sampled_counts(spec)
    microbatches = sum(counts) if counts else spec.plan.num_microbatches
    return spec.plan.pp * p90 * (base + per_microbatch * microbatches)


def plan_timeout(estimate_s: float) -> float:
    return max(WALL_FACTOR * estimate_s, MIN_PLAN_S)


def within_budget(specs: list[RunSpec], budget_s: float, where: str) -> list[float]:
    """Each plan's estimate, or VerifyRefused if there are too many plans or their sum is over ``budget_s``."""
    if len(specs) > MAX_PLANS:
        raise VerifyRefused(f"plans: at most {MAX_PLANS} plans may be verified at once, not {len(specs)}")
    estimates = [plan_seconds(s) for s in specs]
    if sum(estimates) > budget_s:
        each = ", ".join(f"{e:.0f}" for e in estimates)
        raise VerifyRefused(
            f"plans: tracing them is estimated at {sum(estimates):.0f} s ({each} s a plan: "
            f"{', '.join(str(s.plan.pp) for s in specs)} pipeline stages), over the {budget_s:.0f} s budget of "
            f"{where}; verify fewer plans at once, or from the shell (python -m serve verify --budget-s)"
        )
    return estimates
