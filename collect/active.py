"""Which plans to measure next: acquisition over a surrogate's predictions, per unit of device time.

A sweep pays for every plan it measures in device-hours: devices x (start-up + warm-up and timed steps x the
step's time). Given, for each unmeasured plan, the surrogate's predicted log time and its ensemble spread, the
strategies pick a batch:

- random: uniformly (the baseline every sweep has today);
- uncertainty: the largest spread first (what a learner knows least), whatever it costs;
- active: spread per device-hour, so that cheap small plans that inform the large ones come first, weighted up
  where the plan could be the fastest of its group (a search returns the top of the ranking, so its error there
  matters most), and spread over groups within a batch: each pick halves the score of the rest of its group.

An active sweep (``sampler: active``) is an ActiveLoop: measure a random check set (never learned from, the
held-out plans its MAPE is read on) and a random seed set, then fit the surrogate, choose a batch, measure it,
and again, until the budget is spent or the check MAPE reaches the target. The loop's state is its stored rows
alone, so a sweep stopped anywhere resumes where it was. The surrogate is the caller's (collect imports no
model; gnn.acquire supplies one): this module only scores, selects and keeps account.
"""

from __future__ import annotations

import random
from typing import Protocol

import numpy as np

from collect.schema import RunSpec
from collect.sweep import SweepSpec, sample_by_layout

STRATEGIES = ("random", "uncertainty", "active")
TOP_WEIGHT = 2.0  # how much more a plan that may be its group's fastest counts
GROUP_DISCOUNT = 0.5  # a batch's second pick from one group scores half, the third a quarter, ...


def device_hours(devices: np.ndarray, step_s: np.ndarray, startup_s: float | np.ndarray, steps: int) -> np.ndarray:
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


class TimeModel(Protocol):
    """What an active sweep asks of a model of log iteration time (gnn.acquire's): fitted on the measured plans,
    a mean and a spread for each candidate."""

    def fit(self, points: list[RunSpec], log_times: np.ndarray) -> None: ...

    def predict(self, points: list[RunSpec]) -> tuple[np.ndarray, np.ndarray]:
        """(mean, spread) of each plan's predicted log iteration time."""
        ...


def plan_group(point: RunSpec) -> str:
    """A search's question: one model on one number of devices (batch sizes vary within it)."""
    w = point.workload
    return f"{w.family}:{w.layers}x{w.hidden}x{w.seq_len}:{w.experts}/{point.cluster.world_size}"


class ActiveLoop:
    """The state of an active sweep, rebuilt from its rows: which plans are measured, what they cost, what is
    next. ``candidates``: every plan the sweep may measure (collect.sweep.all_points)."""

    def __init__(self, spec: SweepSpec, candidates: list[RunSpec], surrogate: TimeModel | None, rows: list[dict] = ()):
        self.spec, self.surrogate = spec, surrogate
        self.points = {p.run_id: p for p in candidates}
        picker = random.Random(spec.seed)
        check = sample_by_layout(candidates, spec.check_runs, picker)
        self.check_ids = {p.run_id for p in check}
        rest = [p for p in candidates if p.run_id not in self.check_ids]
        self.seed_ids = {p.run_id for p in sample_by_layout(rest, spec.seed_runs, picker)}
        self.rows: dict[str, dict] = {}
        self.check_mape: float | None = None
        self.fitted = False
        self.stopped_by = ""
        for row in rows:
            self.add(row)

    def add(self, row: dict) -> None:
        if row.get("is_reference") not in (True, 1) and row.get("run_id") in self.points:
            self.rows[row["run_id"]] = row

    @property
    def runs(self) -> int:
        """Plans measured, not counting the check set."""
        return sum(run_id not in self.check_ids for run_id in self.rows)

    @property
    def spent_hours(self) -> float:
        """Device-hours of the plans measured, not counting the check set: devices x the measurement's wall time."""
        return sum(_hours(r) for run_id, r in self.rows.items() if run_id not in self.check_ids)

    @property
    def finished(self) -> bool:
        """Every check and seed plan is measured and the budget is spent (no surrogate needed to tell)."""
        return (self.check_ids | self.seed_ids) <= set(self.rows) and self._budget_left() is None

    def next_batch(self) -> list[tuple[RunSpec, str]]:
        """(plan, role) pairs to measure next, role check | seed | acquired; empty when the sweep is done."""
        for role, ids in (("check", self.check_ids), ("seed", self.seed_ids)):
            missing = sorted(ids - set(self.rows))
            if missing:
                return [(self.points[i], role) for i in missing]
        left = self._budget_left()
        if left is None:
            return []
        self._fit()
        if self.spec.target_mape is not None and self.check_mape is not None:
            if self.check_mape <= self.spec.target_mape:
                self.stopped_by = f"check MAPE {100 * self.check_mape:.1f}% reached the target"
                return []
        return [(p, "acquired") for p in self._choose(left)]

    def _budget_left(self) -> tuple[int, float] | None:
        """(runs, device-hours) the budget still allows, None when it is spent (or nothing is left to measure)."""
        runs = self.spec.budget_runs - self.runs if self.spec.budget_runs else self.spec.batch_size
        hours = self.spec.budget_device_hours - self.spent_hours if self.spec.budget_device_hours else np.inf
        if runs <= 0 or hours <= 0:
            self.stopped_by = "the budget is spent"
            return None
        if len(self.rows) == len(self.points):
            self.stopped_by = "every plan of the space is measured"
            return None
        return min(runs, self.spec.batch_size), hours

    def _fit(self) -> None:
        timed = [(self.points[i], r["iter_time_s"]) for i, r in self.rows.items() if _timed(r)]
        train = [(p, t) for p, t in timed if p.run_id not in self.check_ids]
        check = [(p, t) for p, t in timed if p.run_id in self.check_ids]
        self.fitted = len(train) >= 2
        if not self.fitted:  # nothing to learn from yet (the seed plans failed): choose at random
            return
        self.surrogate.fit([p for p, _ in train], np.log([t for _, t in train]))
        if check:
            mean, _ = self.surrogate.predict([p for p, _ in check])
            self.check_mape = float(np.mean(np.abs(np.exp(mean) / np.array([t for _, t in check]) - 1)))

    def _choose(self, left: tuple[int, float]) -> list[RunSpec]:
        k, hours = left
        todo = [p for i, p in self.points.items() if i not in self.rows]
        if self.fitted:
            mean, spread = self.surrogate.predict(todo)
        else:
            mean, spread = np.zeros(len(todo)), np.zeros(len(todo))
        cost = self.predicted_hours(todo, mean)
        affordable = np.flatnonzero(cost <= hours)
        if not len(affordable):
            affordable = np.array([int(np.argmin(cost))])  # the budget is nearly spent: its cheapest plan ends it
        rng = np.random.default_rng([self.spec.seed, len(self.rows)])
        groups = np.array([plan_group(todo[i]) for i in affordable])
        strategy = self.spec.acquisition if self.fitted else "random"
        picked = affordable[
            select_batch(strategy, k, mean[affordable], spread[affordable], cost[affordable], groups, rng)
        ]
        within = np.cumsum(cost[picked]) <= hours  # the whole batch within what is left, not each plan alone
        return [todo[i] for i in picked[: max(1, int(within.sum()))]]

    def predicted_hours(self, points: list[RunSpec], log_time: np.ndarray) -> np.ndarray:
        """What measuring each plan would cost: its devices x (this sweep's measured overhead per plan on that
        many devices + its steps at the predicted step time)."""
        m = self.spec.measure
        steps = m.memory_window_iters + m.warmup_iters + m.timed_iters
        devices = np.array([p.cluster.world_size for p in points])
        overhead = {ws: self._overhead_s(ws, steps) for ws in set(devices.tolist())}
        return device_hours(
            devices, np.exp(np.asarray(log_time, float)), np.array([overhead[d] for d in devices]), steps
        )

    def _overhead_s(self, world_size: int, steps: int) -> float:
        """Median wall time a measurement took beyond its steps (start-up, model build): on this many devices,
        else on any."""
        timed = [r for r in self.rows.values() if _timed(r) and r.get("wall_s")]
        same = [r for r in timed if r["world_size"] == world_size] or timed
        return float(np.median([max(r["wall_s"] - steps * r["iter_time_s"], 0.0) for r in same])) if same else 0.0


def _timed(row: dict) -> bool:
    t = row.get("iter_time_s")
    return t is not None and np.isfinite(t) and t > 0


def _hours(row: dict) -> float:
    """0 for a row without a wall time (a plan that killed a torchrun job: its cost is unknown)."""
    devices, wall = row.get("world_size"), row.get("wall_s")
    known = devices is not None and wall is not None and np.isfinite(devices) and np.isfinite(wall)
    return devices * wall / 3600 if known else 0.0
