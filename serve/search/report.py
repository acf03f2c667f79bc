"""A search's answer for people: one line per plan, and the table of the best plans."""

from __future__ import annotations

from tabulate import tabulate

from serve.schemas import SearchResponse


def plan_label(plan, micro_batch_size: int, float8: str = "none", moe: bool = False, searched: bool = False) -> str:
    """One line per plan: a moe model's names its ep and etp; a precision other than the dtype, and every
    precision where precisions were ``searched`` (they are on bfloat16 workloads: 'none' is bf16), is named."""
    parts = [
        f"dp{plan.dp} tp{plan.tp} pp{plan.pp}"
        + (f" cp{plan.cp}" if plan.cp > 1 else "")
        + (f" ep{plan.ep}" if plan.ep > 1 or moe else "")
        + (f" etp{plan.expert_tp}" if moe else ""),
        plan.sharding,
        f"recompute={plan.recompute}",
        f"mbs={micro_batch_size} x{plan.num_microbatches}",
    ]
    if plan.pp > 1:
        parts.append(plan.pp_schedule + (f"/v{plan.virtual_stages}" if plan.virtual_stages > 1 else ""))
    if plan.sequence_parallel:
        parts.append("sp")
    if float8 in ("mxfp8", "nvfp4"):
        parts.append(float8)
    elif float8 != "none":
        parts.append(f"fp8={float8}" + ("+ag" if plan.float8_all_gather else ""))
    elif searched:
        parts.append("bf16")
    return " ".join(parts)


def print_table(response: SearchResponse) -> None:
    rows = []
    for i, r in enumerate(response.best, 1):
        p = r.prediction
        lo, hi = p.iter_time_interval_s
        rows.append(
            [
                i,
                plan_label(r.plan, r.micro_batch_size, r.float8, response.moe, bool(response.precisions)),
                f"{p.iter_time_s * 1e3:.1f}",
                f"{lo * 1e3:.1f}-{hi * 1e3:.1f}",
                f"{p.peak_mem_bytes / 2**30:.2f}",
                "yes" if p.fits else "no",
                f"{p.oom_risk:.0%}",
                f"{p.breakdown['compute']:.0%}/{p.breakdown['communication_exposed']:.0%}/{p.breakdown['bubble']:.0%}",
            ]
        )
    print(
        f"{response.objective} search ({response.sampler}): {response.trials} trials "
        f"({response.feasible_trials} feasible) "
        f"over a space of {response.space_size} plans; model {response.model.get('uri', response.model.get('run_id'))}"
    )
    print(
        tabulate(
            rows,
            headers=["#", "plan", "time ms", "80% interval", "peak GiB", "fits", "oom risk", "compute/comm/bubble"],
        )
    )
    if response.pareto:
        print(f"Pareto front (time vs memory): {len(response.pareto)} plans")
