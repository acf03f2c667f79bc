"""The physics alone (the simulator fitted to nothing) on the H100's measured runs, priced from the datasheet and
from the kernel table measured on an H100 (data/hardware/kernels/), side by side.

    python -m experiments.kernels.physics [--table h100-sxm-20261127] [--multi-node 200]

Rows: the Ultra-Scale Playbook's finished runs on one node (compute and NVLink only) and a seeded sample of its
multi-node runs, and NVIDIA's published H100 runs (data/runs/published-h100). Writes
experiments/results/kernels_physics.json: per group and pricing, MAPE, median APE and bias (the geometric mean of
predicted over measured), and every published row.
"""

from __future__ import annotations

import argparse
import copy
import json

import numpy as np
import pandas as pd

from collect import REPO
from collect.hardware.records import load_hardware
from gnn.costs.hardware import HardwareModel
from gnn.dataset.graphs import featurize_spec
from gnn.dataset.rows import measured_pp_rank, row_to_spec

RUNS = REPO / "data" / "runs"
OUT = REPO / "experiments" / "results" / "kernels_physics.json"
PRESET = "h100-80gb"


def hardware(table: str | None) -> HardwareModel:
    record = copy.deepcopy(load_hardware(PRESET, str(REPO / "data" / "hardware")))
    record["kernels"].pop("table", None)
    if table:
        record["kernels"]["table"] = table
    return HardwareModel(record)


def rows(multi_node: int) -> dict[str, pd.DataFrame]:
    playbook = pd.concat([pd.read_parquet(RUNS / f"{n}.parquet") for n in ("playbook-h100", "playbook-h100-8b")])
    playbook = playbook[playbook.status == "ok"]
    published = pd.read_parquet(RUNS / "published-h100.parquet")
    multi = playbook[playbook.nodes > 1]
    return {
        "playbook_one_node": playbook[playbook.nodes == 1],
        "playbook_multi_node_sample": multi.sample(min(multi_node, len(multi)), random_state=0),
        "published_h100": published[published.status == "ok"],
    }


def physics_seconds(row, hw: HardwareModel) -> float:
    spec, _, flags = row_to_spec(row)
    _, flat = featurize_spec(spec, hw, flags, measured_pp_rank(row))
    return float(np.exp(flat["f_log_sim_time"]))


def stats(pred: np.ndarray, true: np.ndarray) -> dict:
    ape = np.abs(pred / true - 1) * 100
    return {
        "rows": int(len(true)),
        "mape": round(float(ape.mean()), 1),
        "median_ape": round(float(np.median(ape)), 1),
        "bias": round(float(np.exp(np.mean(np.log(pred / true)))), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--table", default="h100-sxm-20261127")
    parser.add_argument("--multi-node", type=int, default=200, help="multi-node Playbook rows sampled")
    args = parser.parse_args()
    pricings = {"datasheet": hardware(None), f"table {args.table}": hardware(args.table)}
    report: dict = {"table": args.table, "groups": {}, "published": []}
    for group, df in rows(args.multi_node).items():
        true = df["iter_time_s"].to_numpy(dtype=float)
        preds = {name: np.array([physics_seconds(r, hw) for _, r in df.iterrows()]) for name, hw in pricings.items()}
        report["groups"][group] = {name: stats(p, true) for name, p in preds.items()}
        print(group, json.dumps(report["groups"][group]), flush=True)
        if group == "published_h100":
            for i, (_, r) in enumerate(df.iterrows()):
                found = {n: round(float(p[i]), 3) for n, p in preds.items()}
                keys = ("source", "layers", "hidden", "nodes", "tp", "pp", "cp", "float8", "iter_time_s")
                report["published"].append({k: _plain(r.get(k)) for k in keys} | found)
    fallbacks = sorted(pricings[f"table {args.table}"].kernels.fallbacks)
    report["fallbacks"] = fallbacks
    OUT.write_text(json.dumps(report, indent=1) + "\n")
    print("table fallbacks:", fallbacks)


def _plain(v):
    return v.item() if hasattr(v, "item") else v


if __name__ == "__main__":
    main()
