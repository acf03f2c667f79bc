"""The physics alone (the simulator fitted to nothing) on measured runs of the GPUs whose kernel tables were measured
(data/hardware/kernels/), priced from the datasheet and from the table of the GPU's preset, side by side.

    python -m experiments.kernels.physics [--multi-node 200]

Rows, on the H100 (h100-80gb): the Ultra-Scale Playbook's finished runs on one node (compute and NVLink only) and a
seeded sample of its multi-node runs, and NVIDIA's published H100 runs (data/runs/published-h100). On the H200
(h200-141gb): the collector's own runs there (gpu-h200-playbook-v1: the Playbook's shapes at tp 1, measured the
evening its table was; gpu-h200-v1 and the probe: models of 0.1B to 1.2B, steps of 10 to 200 ms). Writes
experiments/results/kernels_physics.json: per group and pricing, MAPE, median APE and bias (the geometric mean of
predicted over measured), and every published row.
"""

from __future__ import annotations

import argparse
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


def hardware(preset: str, table: bool) -> HardwareModel:
    """A preset as it is (with its table), or without its table (the datasheet)."""
    record = load_hardware(preset, str(REPO / "data" / "hardware"))  # a fresh copy
    if not table:
        record["kernels"].pop("table", None)
    return HardwareModel(record)


def rows(multi_node: int) -> dict[str, tuple[str, pd.DataFrame]]:
    """Each group's rows beside the preset of the GPU they ran on."""
    playbook = pd.concat([pd.read_parquet(RUNS / f"{n}.parquet") for n in ("playbook-h100", "playbook-h100-8b")])
    playbook = playbook[playbook.status == "ok"]
    published = pd.read_parquet(RUNS / "published-h100.parquet")
    multi = playbook[playbook.nodes > 1]
    small = pd.concat([pd.read_parquet(RUNS / f"{n}.parquet") for n in ("gpu-h200-v1", "probe-h200-20261126")])
    return {
        "playbook_one_node": ("h100-80gb", playbook[playbook.nodes == 1]),
        "playbook_multi_node_sample": ("h100-80gb", multi.sample(min(multi_node, len(multi)), random_state=0)),
        "published_h100": ("h100-80gb", published[published.status == "ok"]),
        "collector_h200_playbook_shapes": ("h200-141gb", pd.read_parquet(RUNS / "gpu-h200-playbook-v1.parquet")),
        "collector_h200_small": ("h200-141gb", small[small.status == "ok"]),
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
    parser.add_argument("--multi-node", type=int, default=200, help="multi-node Playbook rows sampled")
    args = parser.parse_args()
    groups = rows(args.multi_node)
    report: dict = {"presets": {g: preset for g, (preset, _) in groups.items()}, "groups": {}, "published": []}
    report["fallbacks"] = {}
    for group, (preset, df) in groups.items():
        pricings = {"datasheet": hardware(preset, table=False), "table": hardware(preset, table=True)}
        true = df["iter_time_s"].to_numpy(dtype=float)
        preds = {name: np.array([physics_seconds(r, hw) for _, r in df.iterrows()]) for name, hw in pricings.items()}
        report["groups"][group] = {name: stats(p, true) for name, p in preds.items()}
        report["fallbacks"][group] = sorted(pricings["table"].kernels.fallbacks)
        print(group, json.dumps(report["groups"][group]), flush=True)
        if group == "published_h100":
            for i, (_, r) in enumerate(df.iterrows()):
                found = {n: round(float(p[i]), 3) for n, p in preds.items()}
                keys = ("source", "layers", "hidden", "nodes", "tp", "pp", "cp", "float8", "iter_time_s")
                report["published"].append({k: _plain(r.get(k)) for k in keys} | found)
    OUT.write_text(json.dumps(report, indent=1) + "\n")
    print("table fallbacks:", report["fallbacks"])


def _plain(v):
    return v.item() if hasattr(v, "item") else v


if __name__ == "__main__":
    main()
