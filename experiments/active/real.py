"""The real run: an active sweep against a random sweep of the same device-hours, measured here one after the other.

    make collect SWEEP=collect/sweeps/active-cpu.yaml && make collect SWEEP=collect/sweeps/active-cpu-random.yaml
    python -m experiments.active.real [--fits 5]

Both sweeps share their space, seed, budget, check set (40 random plans, never learned from) and seed set (16 random
plans); one chooses each later batch by collect.active's ``active`` strategy, the other at random. Each measured its
own copy of the check set; here a plan's check label is the mean of its two measurements, so both are judged on the
same labels (``mape``; ``mape_own_check``: on each sweep's own measurements of the check set, which keeps a drift of
the machine between the two sittings out of the comparison). After the seed set and after every batch, the sweep's
surrogate (gnn.acquire.PlanSurrogate, priced on the active sweep's fingerprint for both, so that only what was
measured differs) is refitted on what that sweep had measured by then and scored on the check set, ``--fits`` times
with different bootstrap seeds (mape_std is their spread: one collection each, so no spread over collections).

Adds ``cpu-real`` to experiments/results/active_collection.json (the replay's file, same fields) and redraws
docs/img/active_collection.png with it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from collect import REPO
from collect.schema import RunSpec
from experiments.active.replay import GRID, hours_to_reach, mean_std, on_grid, plot
from gnn.acquire import PlanSurrogate
from gnn.dataset.rows import row_to_spec

SWEEPS = {"active": "active-cpu", "random": "active-cpu-random"}


def load(runs: Path, sweep: str) -> pd.DataFrame:
    rows = pd.read_parquet(runs / f"{sweep}.parquet")
    return rows[~rows["is_reference"].astype(bool)].reset_index(drop=True)  # in the order measured


def check_labels(sweeps: dict[str, pd.DataFrame]) -> pd.Series:
    """Each check plan's time: the mean over the sweeps that measured it."""
    check = pd.concat([r[r["active_role"] == "check"] for r in sweeps.values()])
    return check[check["iter_time_s"] > 0].groupby("run_id")["iter_time_s"].mean()


def curve(rows: pd.DataFrame, check: dict[str, RunSpec], truth: dict[str, np.ndarray], hardware: str, seed: int,
          batch: int) -> dict[str, list[tuple[float, float]]]:  # fmt: skip
    """Per set of check labels (``truth``): [(device-hours spent, check MAPE)] after the seed set and each batch."""
    train = rows[rows["active_role"] != "check"]
    hours = np.cumsum(train["world_size"] * train["wall_s"]) / 3600
    specs = [row_to_spec(r)[0] for r in train.to_dict("records")]
    timed = (train["iter_time_s"] > 0).to_numpy()
    seeds = int((train["active_role"] == "seed").sum())
    out = {name: [] for name in truth}
    for n in range(seeds, len(train) + 1, batch):
        use = [i for i in range(n) if timed[i]]
        surrogate = PlanSurrogate(hardware, seed=seed)
        surrogate.fit([specs[i] for i in use], np.log(train["iter_time_s"].to_numpy()[use]))
        predicted = np.exp(surrogate.predict(list(check.values()))[0])
        for name, labels in truth.items():
            out[name].append((float(hours.iloc[n - 1]), float(np.mean(np.abs(predicted / labels - 1)))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=str(REPO / "data" / "runs"))
    parser.add_argument("--fits", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "active_collection.json"))
    parser.add_argument("--plot", default=str(REPO / "docs" / "img" / "active_collection.png"))
    args = parser.parse_args()
    sweeps = {s: load(Path(args.runs), name) for s, name in SWEEPS.items()}
    labels = check_labels(sweeps)
    by_id = {r["run_id"]: r for r in pd.concat(sweeps.values()).to_dict("records")}
    check = {i: row_to_spec(by_id[i])[0] for i in labels.index}
    hardware = sweeps["active"]["fingerprint_id"].iloc[0]
    curves = {}
    for s, rows in sweeps.items():
        own = rows[rows["active_role"] == "check"].set_index("run_id")["iter_time_s"].loc[labels.index]
        truth = {"pooled": labels.to_numpy(), "own": own.to_numpy()}
        curves[s] = [curve(rows, check, truth, hardware, k, args.batch) for k in tqdm(range(args.fits), desc=s)]
    grid = np.linspace(0, min(c[0]["pooled"][-1][0] for c in curves.values()), GRID + 1)[1:]
    real = {}
    for s, runs in curves.items():
        mean, std = mean_std(np.array([on_grid(c["pooled"], grid) for c in runs]))
        own, _ = mean_std(np.array([on_grid(c["own"], grid) for c in runs]))
        real[s] = {"device_hours": grid.tolist(), "mape": mean, "mape_std": std, "mape_own_check": own,
                   "check_plans": len(labels), "plans": int((sweeps[s]["active_role"] != "check").sum())}  # fmt: skip
    for s in real:
        real[s]["hours_to_random_final"] = hours_to_reach(grid, np.array(real[s]["mape"]), real["random"]["mape"][-1])
        print(f"{s}: {real[s]['plans']} plans, check MAPE {100 * real[s]['mape'][-1]:.1f}% (on its own sitting's "
              f"check labels {100 * real[s]['mape_own_check'][-1]:.1f}%) at {grid[-1]:.3f} device-h; reaches "
              f"random's final after {real[s]['hours_to_random_final']}")  # fmt: skip
    results = json.loads(Path(args.out).read_text())
    results["cpu-real"] = real
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    plot(results, Path(args.plot))
    print(f"wrote {args.out} and {args.plot}")


if __name__ == "__main__":
    main()
