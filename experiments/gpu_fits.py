"""Does the plan fit? Fits/failed accuracy on the H100 runs, the failed ones included.

    python -m experiments.gpu_fits [--model models:/plansight@champion]

The Ultra-Scale Playbook's runs either finished (they fit) or have no result (crashed or ran out of memory; the
source does not say which): a failed configuration counts as "does not run". The training data keep finished runs
only (gnn.dataset.rows.load_runs), so each H100 split's test rule (random by run id, the largest model, the most
GPUs) is applied here to every run, finished or failed, and a predictor says "fits" when its peak memory is at most
the GPU's memory once what a GPU holds beyond its tensors is added (collect.fake.device; for the GNN its own fits
verdict, which reads that from its interval too). Predictors: the GNN trained on the split (make evaluate's,
build/evaluate/gnn-<split>-*.pt; the served model where there is none, which saw the held-out rows), the simulator's
raw peak, and Megatron's theoretical memory (neither fitted). Writes experiments/results/gpu_fits.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from collect import REPO
from collect.fake.device import allocatable
from collect.store import ResultStore
from gnn.costs.hardware import hardware_model
from gnn.dataset.rows import row_to_spec
from gnn.dataset.splits import random_test
from gnn.graph.build import build_graph
from gnn.inference.predictor import BatchPredictor
from gnn.predictors.baselines import MegatronMemoryPredictor
from gnn.sim.simulate import simulate
from serve.api import load_predictor

# the playbook's runs: its first file (1.3B, 3.6B, 80B) and the 8B model's, published later
RUNS = [REPO / "data" / "runs" / "playbook-h100.parquet", REPO / "data" / "runs" / "playbook-h100-8b.parquet"]


def check_sets(runs: pd.DataFrame) -> dict[str, pd.Series]:
    """The H100 splits' test rules (gnn.dataset.splits), applied to finished and failed runs alike."""
    return {
        "h100/random": random_test(runs["run_id"]),
        "h100/held_out_size": runs["num_params"] == runs["num_params"].max(),
        "h100/held_out_scale": runs["world_size"] == runs["world_size"].max(),
    }


def split_model(split: str, models_dir: Path, served: str):
    """(predictor, name): the newest GNN make evaluate trained on ``split``, else the served model."""
    found = sorted(models_dir.glob(f"gnn-{split.replace('/', '-')}-*.pt"), key=lambda p: p.stat().st_mtime)
    if found:
        return BatchPredictor.load(found[-1], REPO / "data" / "hardware"), found[-1].name
    return load_predictor(served), served


def simulated_peaks(runs: pd.DataFrame) -> pd.Series:
    peaks = []
    for row in tqdm(runs.to_dict("records"), desc="simulating", unit="plan"):
        spec, hw, _ = row_to_spec(row)
        graph = build_graph(spec.workload, spec.plan, spec.cluster, hardware_model(hw))
        peaks.append(simulate(graph).peak_mem_bytes)
    return pd.Series(peaks, index=runs.index)


def accuracy(fits_pred: pd.Series, runs: pd.DataFrame) -> dict:
    ran = runs["status"].eq("ok")
    return {
        "accuracy": float((fits_pred == ran).mean()),
        "finished_predicted_to_fit": float(fits_pred[ran].mean()),
        "failed_predicted_not_to_fit": float((~fits_pred[~ran]).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models:/plansight@champion", help="where a split has no GNN of its own")
    parser.add_argument("--models-dir", default=str(REPO / "build" / "evaluate"))
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "gpu_fits.json"))
    args = parser.parse_args()

    runs = pd.concat([ResultStore(path).load() for path in RUNS], ignore_index=True)
    runs = runs[runs["status"].isin(["ok", "failed"])].reset_index(drop=True)
    usable = runs["memory_bytes"].astype(float).map(lambda m: allocatable(m, "cuda"))
    peaks = {
        "simulator": simulated_peaks(runs),
        "megatron_memory": MegatronMemoryPredictor().predict(runs)["pred_mem_bytes"],
    }
    report = []
    for split, mask in check_sets(runs).items():
        rows = runs[mask]
        predictor, model = split_model(split, Path(args.models_dir), args.model)
        print(f"{split}: GNN {model}")
        verdicts = {name: peak.loc[rows.index] <= usable.loc[rows.index] for name, peak in peaks.items()}
        verdicts["gnn"] = predictor.predict_rows(rows)["fits"].astype(bool)  # the served answer, from its interval
        for name, fits in verdicts.items():
            report.append({"split": split, "predictor": name, "n": len(rows), **accuracy(fits, rows)})
            report[-1]["model"] = model if name == "gnn" else None
    table = pd.DataFrame(report)
    print(table.pivot(index="split", columns="predictor", values="accuracy").round(3).to_string())
    print(f"\n{int(runs['status'].eq('failed').sum())} failed and {int(runs['status'].eq('ok').sum())} finished runs")
    Path(args.out).write_text(json.dumps(report, indent=1, default=float) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
