"""Calibrating the ensemble's intervals: split-conformal factors, and how a prediction is held to its physics.

Used by gnn.model.ensemble; the scores are |measured - predicted| / (spread + floor) in log units, per target.
"""

from __future__ import annotations

import numpy as np


def factors(s: dict, log_time: np.ndarray, log_mem: np.ndarray, rows: np.ndarray, coverage: float) -> list[float]:
    """The conformal factor of log time and of log memory over ``rows`` (NaN where none measured the target)."""
    k = []
    for pred, spread, truth in ((s["log_time"], s["time_spread"], log_time), (s["log_mem"], s["mem_spread"], log_mem)):
        score = (np.abs(truth - pred) / spread)[rows]
        score = score[np.isfinite(score)]
        k.append(conformal_quantile(score, coverage) if len(score) else np.nan)
    return k


def parent(domain: str) -> str:
    """The calibration domain a part of ``domain`` falls back to ("fake" of "fake/pipelined"); a domain with no parts
    is its own."""
    return domain.rsplit("/", 1)[0]


def domain_rows(names: np.ndarray) -> dict[str, np.ndarray]:
    """{calibration domain: its rows}, for each domain named and each parent of one: "fake" holds every row of
    "fake/pipelined" and of "fake/unpipelined"."""
    names = [str(n) for n in names]
    domains = set(names) | {parent(n) for n in names}
    return {d: np.array([n == d or n.startswith(f"{d}/") for n in names], dtype=bool) for d in domains}


def bounded(raw: np.ndarray, floor: np.ndarray, ceiling: np.ndarray, base: np.ndarray | None = None) -> np.ndarray:
    """Each member's log time and memory held between the plan's floor and ceiling ([n, 2] each): no member may
    say what the physics rules out, however far its inputs lie from its training rows. A member outside them is
    out of its depth, not merely too high (sum-pooled states of graphs far larger than any trained on sent members
    trained on NVIDIA's 200 runs to e^35 s on DeepSeek-V3's): given the physics ``base`` it corrects ([n, 2]), it
    says the base instead, held between the same limits."""
    out = raw.copy()
    values = raw[:, :, :2]
    if base is not None:
        fallback = np.clip(base, floor, ceiling)[None]
        with np.errstate(invalid="ignore"):
            outside = ~((values >= floor[None]) & (values <= ceiling[None]))  # NaN counts as outside
        values = np.where(outside & np.isfinite(fallback), fallback, values)
    out[:, :, :2] = np.clip(values, floor[None], ceiling[None])
    return out


def fall_back(point: np.ndarray, spread: np.ndarray, base: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """The physics base plus the members' correction, scaled by min(1, (limit / spread)^2): unchanged while the
    members agree as well as on the validation rows, fading to the base as they disagree more."""
    with np.errstate(divide="ignore", invalid="ignore"):
        weight = np.where(spread <= limit, 1.0, (limit / spread) ** 2)  # one member: spread = limit = 0, weight 1
    ok = np.isfinite(base) & np.isfinite(limit)
    return np.where(ok, base + (point - base) * weight, point)


def conformal_quantile(scores: np.ndarray, coverage: float) -> float:
    """The finite-sample split-conformal quantile: ceil((n+1) q) / n."""
    n = len(scores)
    level = min(1.0, np.ceil((n + 1) * coverage) / n)
    return float(np.quantile(scores, level, method="higher"))


def interval_coverage(lo: np.ndarray, hi: np.ndarray, truth: np.ndarray) -> float | None:
    ok = np.isfinite(truth)
    return float(((truth[ok] >= lo[ok]) & (truth[ok] <= hi[ok])).mean()) if ok.any() else None
