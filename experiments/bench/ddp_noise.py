"""How far apart one-process members of different seeds land on validation MAPE: the noise a DDP member is judged
against (tests/engines/test_ddp.py); and, with --cli, the two training commands themselves, one process and DDP
on two CPU processes, with their wall times and validation MAPE.

    python -m experiments.bench.ddp_noise [--epochs 20] [--seeds 0 1 2 3 4] [--cli [--repeats 2]]

Trains on the shipped vTrain A100 rows (split a100/random), one member each, without the nested checks, as the
test does; the MAPE is the ``val_selection`` gnn.tracking.runs logs (time + memory MAPE of the member on the
validation rows; these rows have no memory, so it is the time MAPE). Writes experiments/results/ddp_noise.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlflow

from collect import REPO
from gnn.dataset.graphs import PlanGraphs
from gnn.dataset.splits import named_splits
from gnn.predictors.surrogate import TrainConfig, train_ensemble
from gnn.tracking.scoring import ensemble_records, selection_value

SPLIT = "a100/random"
RUNS = ["vtrain-a100.parquet"]


def data_root(folder: Path) -> Path:
    """A data root holding the vTrain rows and the repo's hardware records (its graph cache is built there)."""
    (folder / "runs").mkdir(parents=True, exist_ok=True)
    for name in RUNS:
        if not (folder / "runs" / name).exists():
            (folder / "runs" / name).symlink_to(REPO / "data" / "runs" / name)
    if not (folder / "hardware").exists():
        (folder / "hardware").symlink_to(REPO / "data" / "hardware")
    return folder


def train_command(root: Path, epochs: int, seed: int = 0, ddp: bool = False) -> list[str]:
    """The command the test runs and docs/scale-out.md documents (the DDP one with --strategy ddp --devices 2)."""
    cmd = [sys.executable, "-m", "gnn.train", "--members", "1", "--no-checks", "--max-epochs", str(epochs)]
    cmd += ["--split", SPLIT, "--data", str(root), "--seed", str(seed), "--accelerator", "cpu"]
    return cmd + (["--strategy", "ddp", "--devices", "2"] if ddp else [])


def seed_spread(root: Path, epochs: int, seeds: list[int]) -> dict:
    ds = PlanGraphs(root=root)
    parts = named_splits(ds.meta)[SPLIT]
    members = []
    for seed in seeds:
        start = time.perf_counter()
        cfg = TrainConfig(max_epochs=epochs, seed=seed, members=1)
        ensemble = train_ensemble(ds, parts, cfg, progress=False, nested_checks=False, accelerator="cpu", devices=1)
        mape = selection_value(ensemble_records(ensemble, ds, parts, SPLIT)[0])
        members.append({"seed": seed, "val_selection": mape, "seconds": time.perf_counter() - start})
        print(f"seed {seed}: val MAPE {mape:.4f} ({members[-1]['seconds']:.0f} s)", flush=True)
    values = [m["val_selection"] for m in members]
    return {
        "members": members,
        "range": max(values) - min(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def cli_runs(root: Path, epochs: int, repeats: int) -> dict:
    """Both training commands, alternately (machine drift falls on both alike), each into a throwaway MLflow
    store: wall seconds, the train_seconds and the val_selection each logged."""
    out = {}
    for i in range(repeats):
        for name, ddp in (("one_process", False), ("ddp_2_cpu_processes", True)):
            env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{root}/mlflow-{name}-{i}.db"}
            cmd = train_command(root, epochs, ddp=ddp)
            start = time.perf_counter()
            subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wall = time.perf_counter() - start
            client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
            (run,) = client.search_runs([client.get_experiment_by_name("plansight").experiment_id])
            entry = out.setdefault(name, {"command": " ".join(["python", *cmd[1:]]).replace(str(root), "DATA_ROOT")})
            entry.setdefault("wall_s", []).append(wall)
            entry.setdefault("train_seconds", []).append(run.data.metrics["train_seconds"])
            entry.setdefault("val_selection", []).append(run.data.metrics["val_selection"])
            print(f"{name}: {wall:.0f} s wall, val MAPE {run.data.metrics['val_selection']:.4f}", flush=True)
    for entry in out.values():
        entry["median_wall_s"] = statistics.median(entry["wall_s"])
        entry["median_train_seconds"] = statistics.median(entry["train_seconds"])
    mape = {name: entry["val_selection"][0] for name, entry in out.items()}
    out["abs_difference"] = abs(mape["one_process"] - mape["ddp_2_cpu_processes"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--cli", action="store_true", help="also time the one-process and the DDP command")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each command, with --cli")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = data_root(Path(tmp))
        result = {"split": SPLIT, "epochs": args.epochs, "cpus": os.cpu_count()}
        result["one_process_seeds"] = seed_spread(root, args.epochs, args.seeds)
        if args.cli:
            result["cli"] = cli_runs(root, args.epochs, args.repeats)
    path = REPO / "experiments" / "results" / "ddp_noise.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
