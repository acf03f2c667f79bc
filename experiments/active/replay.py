"""How many device-hours each collection strategy needs to reach an accuracy: a simulation over measured pools.

    python -m experiments.active.replay [--seeds 5] [--rounds 12] [--batch 16]

Every plan of a pool is already measured; the labels are hidden and a strategy "measures" a batch by revealing
it, paying its device-hours (collect.active.device_hours). After each batch the surrogate is refitted on what
has been revealed and scored (time MAPE) on a fixed test set of the pool (15% by run id, never revealed).
Strategies: collect.active's random, uncertainty and active. Every strategy starts from the same random seed
batch; random then measures ``rounds`` more batches, and the others measure until they have spent as much.

The surrogate is the one an active sweep uses (gnn.acquire.ResidualTrees: gradient-boosted trees on the plan
features correcting the physics simulator's log time, each member on a bootstrap of the revealed rows; spread =
the members' standard deviation), here on the graph dataset's precomputed features.
Costs: the CPU pool's wall time of each measurement as recorded
(build, memory window, timed steps); the GPU pools' are estimated, as their sources give no wall time:
ASSUMED_STARTUP_S of launch and start-up plus the collector's 1 warm-up and 5 timed steps.

Writes experiments/results/active_collection.json (per pool and strategy: device_hours, mape (mean over
seeds), mape_std, hours_to_random_final) and docs/img/active_collection.png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from collect import REPO
from collect.active import STRATEGIES, device_hours, select_batch
from gnn.acquire import ResidualTrees
from gnn.dataset.graphs import PlanGraphs
from gnn.dataset.splits import random_test
from gnn.predictors.base import PLAN_FEATURES_PREFIX

ASSUMED_STARTUP_S = 120.0  # an assumption: torchrun, NCCL communicators and the model built on a GPU node
STEPS = 6  # the collector's protocol: 1 warm-up and 5 timed steps
POOLS = {"h100": "playbook-h100", "a100": "vtrain-a100-single", "cpu": "cpu-v3"}
COLORS = {"random": "C0", "uncertainty": "C1", "active": "C2"}
GRID = 40  # device-hour points the curves are compared on


def pool_rows(meta: pd.DataFrame, sweep: str) -> pd.DataFrame:
    rows = meta[(meta["sweep_id"] == sweep) & (meta["status"] == "ok")].copy()
    if sweep.startswith("cpu"):
        rows["cost_h"] = rows["world_size"] * rows["wall_s"] / 3600.0
    else:
        rows["cost_h"] = device_hours(rows["world_size"], rows["iter_time_s"], ASSUMED_STARTUP_S, STEPS)
    # a search's question: one model shape on one number of devices
    rows["group"] = [
        f"{r.layers}x{r.hidden}/{r.world_size}" for r in rows[["layers", "hidden", "world_size"]].itertuples()
    ]
    return rows.reset_index(drop=True)


class ReplayModel:
    """gnn.acquire's ensemble on the pool's precomputed features: the simulator's log time, corrected."""

    def __init__(self, rows: pd.DataFrame):
        cols = sorted(c for c in rows.columns if c.startswith(PLAN_FEATURES_PREFIX))
        self.x = rows[cols].to_numpy(dtype=float)
        self.base = np.log(rows["sim_time_s"].to_numpy(dtype=float))
        self.y = np.log(rows["iter_time_s"].to_numpy(dtype=float)) - self.base

    def fit_predict(self, known: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(mean, spread) of the predicted log time of every row, from models fitted on the ``known`` rows."""
        mean, spread = ResidualTrees().fit(self.x[known], self.y[known], rng).predict(self.x)
        return self.base + mean, spread


def run(rows: pd.DataFrame, strategy: str, seed: int, batch: int, budget_h: float | None, rounds: int):
    """[(device-hours spent, test MAPE)] after the seed batch and each batch after it."""
    rng = np.random.default_rng(seed)
    test = random_test(rows["run_id"]).to_numpy()
    pool = np.flatnonzero(~test)
    surrogate, truth = ReplayModel(rows), rows["iter_time_s"].to_numpy(dtype=float)
    known = np.random.default_rng(1000 + seed).choice(pool, size=batch, replace=False)  # shared by strategies
    spent, curve = float(rows["cost_h"].to_numpy()[known].sum()), []
    for step in range(10_000):
        mean, spread = surrogate.fit_predict(known, rng)
        mape = float(np.mean(np.abs(np.exp(mean[test]) / truth[test] - 1)))
        curve.append((spent, mape))
        done = step >= rounds if budget_h is None else spent >= budget_h
        left = np.setdiff1d(pool, known)
        if done or not len(left):
            return curve
        pick = left[select_batch(strategy, batch, mean[left], spread[left], rows["cost_h"].to_numpy()[left],
                                 rows["group"].to_numpy()[left], rng)]  # fmt: skip
        known = np.concatenate([known, pick])
        spent += float(rows["cost_h"].to_numpy()[pick].sum())
    return curve


def on_grid(curve: list[tuple[float, float]], grid: np.ndarray) -> np.ndarray:
    """The MAPE reached by each device-hour of the grid (the last batch finished by then; NaN before any)."""
    hours, mape = np.array(curve).T
    at = np.searchsorted(hours, grid, side="right") - 1
    return np.where(at >= 0, mape[np.maximum(at, 0)], np.nan)


def mean_std(stack: np.ndarray) -> tuple[list[float], list[float]]:
    """Mean and spread over runs at each grid point, NaN where no run had a value yet (without numpy's warning)."""
    seen = np.isfinite(stack).any(0)
    mean, std = np.full(stack.shape[1], np.nan), np.full(stack.shape[1], np.nan)
    mean[seen], std[seen] = np.nanmean(stack[:, seen], 0), np.nanstd(stack[:, seen], 0)
    return mean.tolist(), std.tolist()


def hours_to_reach(grid: np.ndarray, mape: np.ndarray, target: float) -> float | None:
    reached = np.flatnonzero(mape <= target)
    return float(grid[reached[0]]) if len(reached) else None


def evaluate_pool(rows: pd.DataFrame, seeds: int, batch: int, rounds: int) -> dict:
    curves = {s: [] for s in STRATEGIES}
    for seed in tqdm(range(seeds), desc="seeds", unit="seed", leave=False):
        random_curve = run(rows, "random", seed, batch, None, rounds)
        curves["random"].append(random_curve)
        for strategy in STRATEGIES[1:]:
            curves[strategy].append(run(rows, strategy, seed, batch, random_curve[-1][0], rounds))
    top = np.mean([c[-1][0] for c in curves["random"]])
    grid = np.linspace(0, top, GRID + 1)[1:]
    out = {}
    for strategy, runs in curves.items():
        mean, std = mean_std(np.array([on_grid(c, grid) for c in runs]))
        out[strategy] = {"device_hours": grid.tolist(), "mape": mean, "mape_std": std}
    final = out["random"]["mape"][-1]
    for strategy in out:
        out[strategy]["hours_to_random_final"] = hours_to_reach(grid, np.array(out[strategy]["mape"]), final)
    return out


def plot(results: dict, path: Path) -> None:
    # lazy: matplotlib is for this figure only
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after choosing the headless backend

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6))
    for ax, (pool, by_strategy) in zip(np.atleast_1d(axes), results.items()):
        for strategy, r in by_strategy.items():
            h, m, s = (np.array(r[k]) for k in ("device_hours", "mape", "mape_std"))
            ax.plot(h, 100 * m, label=strategy, color=COLORS[strategy])
            ax.fill_between(h, 100 * (m - s), 100 * (m + s), alpha=0.2, color=COLORS[strategy])
        title = "cpu, two real sweeps" if pool == "cpu-real" else f"{pool} pool (replayed)"
        ax.set(title=title, xlabel="device-hours spent", ylabel="test time MAPE %")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--pools", nargs="+", default=list(POOLS), choices=list(POOLS))
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "active_collection.json"))
    parser.add_argument("--plot", default=str(REPO / "docs" / "img" / "active_collection.png"))
    args = parser.parse_args()
    meta = PlanGraphs().meta
    results = {}
    for pool in tqdm(args.pools, desc="pools", unit="pool"):
        results[pool] = evaluate_pool(pool_rows(meta, POOLS[pool]), args.seeds, args.batch, args.rounds)
        for strategy, r in results[pool].items():
            print(f"{pool} {strategy}: final MAPE {100 * r['mape'][-1]:.1f}%, reaches random's final MAPE after "
                  f"{r['hours_to_random_final']} of {r['device_hours'][-1]:.1f} device-hours")  # fmt: skip
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    plot(results, Path(args.plot))
    print(f"wrote {args.out} and {args.plot}")


if __name__ == "__main__":
    main()
