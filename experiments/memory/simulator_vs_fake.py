"""The simulator's peak memory against fake-tensor traces of the same plans at full size (data/fake).

    python -m experiments.memory.simulator_vs_fake [--fake data/fake] [--hardware h100]

The simulator (gnn.sim, fitted to nothing) predicts each pipeline rank's peak; a fake sweep (collect.fake.sweep)
traced each stage's first rank running the collector's own code. Both leave out what only the hardware adds, so
they are compared as they are: per plan the largest stage's peak, the error grouped by family, sharding,
recompute, sequence parallelism and pipelining. Writes experiments/results/simulator_vs_fake.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from collect import REPO
from gnn.costs.hardware import hardware_model
from gnn.dataset.rows import load_fake, row_to_spec
from gnn.sim.plan import simulate_plan

GROUPS = ["family", "model", "sharding", "recompute", "sequence_parallel", "pipelined"]


def simulated(rows: pd.DataFrame, hardware: str) -> pd.Series:
    hw, compilers, out = hardware_model(hardware, str(REPO / "data" / "hardware")), {}, {}
    for index, row in tqdm(rows.iterrows(), total=len(rows), desc="simulating", unit="plan"):
        spec, _, _ = row_to_spec(row)
        _, sim = simulate_plan(spec.workload, spec.plan, spec.cluster, hw, compilers)
        out[index] = sim.peak_mem_bytes
    return pd.Series(out)


def summarise(rows: pd.DataFrame, error: pd.Series) -> dict:
    model = rows["family"] + " " + rows["layers"].astype(str) + "x" + rows["hidden"].astype(str)
    frame = rows.assign(error=error, pipelined=rows["pp"] > 1, model=model)
    report = {"plans": int(len(frame)), **_stats(frame["error"])}
    for group in GROUPS:
        report[f"by_{group}"] = {str(k): _stats(g["error"]) for k, g in frame.groupby(group)}
    worst = frame.loc[frame["error"].abs().nlargest(10).index]
    report["worst"] = worst[["run_id", "family", "layers", "world_size", "dp", "tp", "pp", "sharding", "recompute",
                             "sequence_parallel", "micro_batch_size", "error"]].to_dict("records")  # fmt: skip
    return report


def _stats(error: pd.Series) -> dict:
    a = error.abs()
    return {"n": int(len(error)), "median_ape": float(a.median()), "p90_ape": float(np.quantile(a, 0.9)),
            "max_ape": float(a.max()), "bias": float(np.exp(np.log1p(error).mean()))}  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fake", default=str(REPO / "data" / "fake"))
    parser.add_argument("--hardware", default="h100-80gb")
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "simulator_vs_fake.json"))
    args = parser.parse_args(argv)
    rows = load_fake(Path(args.fake))
    error = simulated(rows, args.hardware) / rows["peak_mem_bytes"] - 1
    report = summarise(rows, error)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(json.dumps({k: v for k, v in report.items() if not k.startswith("by_") and k != "worst"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
