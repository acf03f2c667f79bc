"""The simulator's peak memory against fake-tensor traces of the same plans at full size (data/fake).

    python -m experiments.memory.simulator_vs_fake [--fake data/fake] [--hardware h100]

The simulator (gnn.sim, fitted to nothing) predicts each pipeline rank's peak; a fake sweep (collect.fake.sweep)
traced each stage's first rank running the collector's own code. Both leave out what only the hardware adds, so
they are compared as they are: per plan the largest stage's peak, the error grouped by family, sharding,
recompute, sequence parallelism and pipelining; and each traced rank of a pipelined plan, by schedule and role.
Writes experiments/results/simulator_vs_fake.json.
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
    """Each plan's simulated peak, its largest rank's."""
    return simulated_ranks(rows, hardware).map(max)


def simulated_ranks(rows: pd.DataFrame, hardware: str) -> pd.Series:
    """Each plan's simulated peak per pipeline rank."""
    hw, compilers, out = hardware_model(hardware, str(REPO / "data" / "hardware")), {}, {}
    for index, row in tqdm(rows.iterrows(), total=len(rows), desc="simulating", unit="plan"):
        spec, _, _ = row_to_spec(row)
        _, sim = simulate_plan(spec.workload, spec.plan, spec.cluster, hw, compilers)
        out[index] = sim.peak_mem_per_rank
    return pd.Series(out)


def rank_errors(rows: pd.DataFrame, per_rank: pd.Series) -> pd.DataFrame:
    """Each traced rank of the pipelined plans against its pipeline rank's simulated peak: a plan's largest rank
    hides what the others get wrong. Columns: schedule, role (first, middle, last), error."""
    out = []
    for index, row in rows[rows["pp"] > 1].iterrows():
        ranks_per_stage = row["world_size"] // row["pp"]
        for traced, peak in zip(row["traced_ranks"], row["peak_mem_bytes_per_rank"]):
            k = int(traced) // ranks_per_stage
            role = "first" if k == 0 else "last" if k == row["pp"] - 1 else "middle"
            out.append((row["pp_schedule"], role, per_rank[index][k] / peak - 1))
    return pd.DataFrame(out, columns=["schedule", "role", "error"])


def summarise(rows: pd.DataFrame, per_rank: pd.Series) -> dict:
    error = per_rank.map(max) / rows["peak_mem_bytes"] - 1
    model = rows["family"] + " " + rows["layers"].astype(str) + "x" + rows["hidden"].astype(str)
    frame = rows.assign(error=error, pipelined=rows["pp"] > 1, model=model)
    report = {"plans": int(len(frame)), **_stats(frame["error"])}
    for group in GROUPS:
        report[f"by_{group}"] = {str(k): _stats(g["error"]) for k, g in frame.groupby(group)}
    ranks = rank_errors(rows, per_rank)
    report["pipelined_ranks"] = {f"{k[0]} {k[1]}": _stats(g["error"]) for k, g in ranks.groupby(["schedule", "role"])}
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
    report = summarise(rows, simulated_ranks(rows, args.hardware))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(json.dumps({k: v for k, v in report.items() if not k.startswith("by_") and k != "worst"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
