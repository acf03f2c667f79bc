"""What verifying plans costs, estimated before any trace runs, and the budgets that bound it.

A plan is verified by tracing the first rank of each pipeline stage in a process of its own (collect.fake.sweep
.trace_point). A stage's trace costs about the same whatever the world size (FSDP makes only the chunks it reads)
and the depth (a deep stack is traced at three shallow depths), and more for a mixture of experts (an operation
per local expert) and for a plan of many micro-batches (traced at two counts). STAGE_SECONDS is the 90th percentile
of the wall seconds per stage of the full-size sweeps in data/fake (fake-full-v1 and fake-full-nopp-v1, 116
depth-extrapolated plans of 8B-671B models on 8-16,384 ranks, two traces at once on this 2-core machine), by those
two traits: an upper bound for most plans, not a mean.
"""

from __future__ import annotations

from collect.fake.sweep import sampled_counts
from collect.schema import RunSpec

# (a mixture of experts, traced at two micro-batch counts) -> wall seconds per stage, p90 (median in the comment)
STAGE_SECONDS = {
    (False, False): 11.0,  # median 8.7
    (False, True): 26.0,  # median 20.4
    (True, False): 50.0,  # median 19.7
    (True, True): 162.0,  # median 35.0
}
WALL_FACTOR = 3.0  # a plan's traces get this multiple of its estimate (at least MIN_PLAN_S) before they are stopped
MIN_PLAN_S = 60.0
HTTP_SECONDS = 300.0  # POST /verify: a plan or two of the largest dense models, one pipelined MoE of a few stages
CLI_SECONDS = 3600.0  # python -m serve verify on one's own machine (--budget-s)
MAX_PLANS = 16  # plans one request may verify


class VerifyRefused(ValueError):
    """A verify request over its budget: the message gives the estimate and what to change."""


def plan_seconds(spec: RunSpec) -> float:
    """A plan's estimated wall seconds to trace: each stage's at STAGE_SECONDS."""
    kind = (spec.workload.family == "moe", sampled_counts(spec) is not None)
    return spec.plan.pp * STAGE_SECONDS[kind]


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
