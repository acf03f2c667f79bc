"""Which plans to measure next: acquisition over a surrogate's predictions, per unit of device time.

A sweep pays for every plan it measures in device-hours: devices x (start-up + warm-up and timed steps x the
step's time). Given, for each unmeasured plan, the surrogate's predicted log time and its ensemble spread, the
strategies pick a batch:

- random: uniformly (the baseline every sweep has today);
- uncertainty: the largest spread first (what a learner knows least), whatever it costs;
- active: spread per device-hour, so that cheap small plans that inform the large ones come first, weighted up
  where the plan could be the fastest of its group (a search returns the top of the ranking, so its error there
  matters most), and spread over groups within a batch: each pick halves the score of the rest of its group.

The surrogate is the caller's (collect imports no model): this module only scores and selects.
"""

from __future__ import annotations

import numpy as np

STRATEGIES = ("random", "uncertainty", "active")
TOP_WEIGHT = 2.0  # how much more a plan that may be its group's fastest counts
GROUP_DISCOUNT = 0.5  # a batch's second pick from one group scores half, the third a quarter, ...


def device_hours(devices: np.ndarray, step_s: np.ndarray, startup_s: float, steps: int) -> np.ndarray:
    """What measuring each plan costs: its devices for start-up plus ``steps`` steps of ``step_s`` seconds."""
    return np.asarray(devices, float) * (startup_s + steps * np.asarray(step_s, float)) / 3600.0


def may_be_fastest(mean: np.ndarray, spread: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """True where a plan's optimistic time (mean - spread, in log seconds) beats its group's best mean: it could
    be the plan a search returns for that workload and cluster."""
    mean, spread, groups = np.asarray(mean, float), np.asarray(spread, float), np.asarray(groups)
    best = {g: mean[groups == g].min() for g in np.unique(groups)}
    return mean - spread <= np.array([best[g] for g in groups])


def select_batch(
    strategy: str,
    k: int,
    mean: np.ndarray,
    spread: np.ndarray,
    cost: np.ndarray,
    groups: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """Indices of ``k`` candidates to measure next (fewer if there are fewer)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is not one of {STRATEGIES}")
    n = len(mean)
    k = min(k, n)
    if strategy == "random":
        return rng.choice(n, size=k, replace=False)
    spread = np.asarray(spread, float)
    if strategy == "uncertainty":
        return np.argsort(-spread, kind="stable")[:k]
    score = spread / np.maximum(np.asarray(cost, float), 1e-12)
    score = score * np.where(may_be_fastest(mean, spread, groups), TOP_WEIGHT, 1.0)
    return _diverse_top(score, np.asarray(groups), k)


def _diverse_top(score: np.ndarray, groups: np.ndarray, k: int) -> np.ndarray:
    score = score.astype(float).copy()
    picked = []
    for _ in range(k):
        i = int(np.argmax(score))
        picked.append(i)
        score[i] = -np.inf
        same = groups == groups[i]
        score[same] *= GROUP_DISCOUNT
    return np.array(picked)
