"""Plans as a person reads them at a shell: one line per plan, times in seconds, memory in GiB, the 80% intervals,
whether it fits and where its time goes. `serve predict` and `serve search` print these; `--json` is for scripts.
"""

from __future__ import annotations

from tabulate import tabulate

from collect.schema import Plan
from serve.schemas import PlanPrediction, PredictResponse, SearchResponse


def plan_label(
    plan: Plan, micro_batch_size: int, float8: str = "none", moe: bool = False, searched: bool = False
) -> str:
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


def _cells(p: PlanPrediction) -> list[str]:
    """time, its interval, peak, its interval, fits, oom risk and the time's shares, as printed."""
    (t_lo, t_hi), (m_lo, m_hi) = p.iter_time_interval_s, p.peak_mem_interval_bytes
    shares = p.breakdown
    return [
        f"{p.iter_time_s:.3g}",
        f"{t_lo:.3g}-{t_hi:.3g}",
        f"{p.peak_mem_bytes / 2**30:.2f}",
        f"{m_lo / 2**30:.1f}-{m_hi / 2**30:.1f}",
        "yes" if p.fits else "no",
        f"{p.oom_risk:.0%}",
        f"{shares['compute']:.0%}/{shares['communication_exposed']:.0%}/{shares['bubble']:.0%}",
    ]


HEADERS = ["time s", "80%", "peak GiB", "80%", "fits", "oom risk", "compute/comm/bubble"]


def model_name(model: dict) -> str:
    return str(model.get("uri") or model.get("name") or model.get("run_id"))


def predict_table(response: PredictResponse, plans: list[Plan], micro_batch_size: int, moe: bool) -> str:
    """The predictions in plan order, then what lies outside the training runs, plan by plan."""
    rows = [
        [i, plan_label(plan, micro_batch_size, moe=moe), *_cells(p)]
        for i, (plan, p) in enumerate(zip(plans, response.predictions), 1)
    ]
    lines = [
        f"model {model_name(response.model)}; intervals: {response.calibration}; compute priced from "
        f"{response.compute_pricing}",
        tabulate(rows, headers=["#", "plan", *HEADERS]),
    ]
    if response.probe:
        probe = response.probe
        lines.append(
            f"probe {probe['probe']} ({probe['runs']} runs): times x{probe['time_factor']:.3g}, "
            f"log sd {probe['log_sd']:.2f}"
        )
    for i, p in enumerate(response.predictions, 1):
        if p.extrapolation:
            lines.append(f"#{i} outside the training runs: " + "; ".join(p.extrapolation))
    return "\n".join(lines)


def search_table(response: SearchResponse, quantile: float = 0.5) -> str:
    """The top plans, with the time at ``quantile`` (the request's time_quantile) they were ranked by."""
    rows = [
        [
            i,
            plan_label(r.plan, r.micro_batch_size, r.float8, response.moe, bool(response.precisions)),
            *_cells(r.prediction)[:2],
            f"{r.ranked_time_s:.3g}",
            *_cells(r.prediction)[2:3],
            *_cells(r.prediction)[4:],
        ]
        for i, r in enumerate(response.best, 1)
    ]
    headers = ["#", "plan", "time s", "80% interval", f"q{quantile:g} s", "peak GiB", *HEADERS[4:]]
    lines = [
        f"{response.objective} search ({response.sampler}): {response.trials} trials "
        f"({response.feasible_trials} feasible) over a space of {response.space_size} plans; "
        f"model {response.model.get('uri', response.model.get('run_id'))}",
        tabulate(rows, headers=headers),
    ]
    if response.pareto:
        lines.append(f"Pareto front (time vs memory): {len(response.pareto)} plans")
    return "\n".join(lines)
