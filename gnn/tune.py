"""Hyper-parameter search for the surrogate: Optuna over Lightning, pruned, on RDB storage.

    python -m gnn.tune [--trials 20] [--timeout 1800] [--storage sqlite:///optuna.db] [--study gnn-all-random]

Each trial trains one member on the split's training rows and reports the
validation selection metric (time MAPE + memory MAPE) every epoch; the median
pruner stops trials that fall behind. Storage is a sqlite file by default and
any SQLAlchemy URL (e.g. PostgreSQL, for many workers on one study); a study
of the same name is resumed, so an interrupted search continues where it
stopped. Every trial is an MLflow run nested under the study's run. The best
parameters are written to experiments/results/tuning.json.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, replace
from pathlib import Path

import mlflow
import optuna
from optuna_integration import PyTorchLightningPruningCallback

from collect import REPO
from gnn.dataset.graphs import PlanGraphs
from gnn.dataset.splits import SERVING_SPLIT, named_splits
from gnn.predictors.surrogate import SELECTION_METRIC, TrainConfig, fit
from gnn.tracking.runs import dataset_version, setup

DEFAULT_STORAGE = f"sqlite:///{REPO / 'optuna.db'}"


def sample_config(trial: optuna.Trial, base: TrainConfig) -> TrainConfig:
    return replace(
        base,
        hidden=trial.suggest_categorical("hidden", [32, 64, 128]),
        num_layers=trial.suggest_int("num_layers", 1, 4),
        dropout=trial.suggest_float("dropout", 0.0, 0.3),
        lr=trial.suggest_float("lr", 3e-4, 1e-2, log=True),
        weight_decay=trial.suggest_float("weight_decay", 1e-6, 1e-3, log=True),
        batch_size=trial.suggest_categorical("batch_size", [32, 64, 128]),
        loss=trial.suggest_categorical("loss", ["l1", "mse"]),
        memory_weight=trial.suggest_float("memory_weight", 0.5, 4.0, log=True),
    )


def objective(ds: PlanGraphs, parts: dict, base: TrainConfig):
    def run(trial: optuna.Trial) -> float:
        cfg = sample_config(trial, base)
        with mlflow.start_run(run_name=f"trial {trial.number}", nested=True):
            mlflow.log_params({**asdict(cfg), "trial": trial.number})
            module = fit(ds, parts, cfg, callbacks=[PyTorchLightningPruningCallback(trial, SELECTION_METRIC)])
            mlflow.log_metrics({"val_selection": module.best_val_mape, "epochs": module.epochs_trained})
        return module.best_val_mape

    return run


def tune(
    ds: PlanGraphs,
    parts: dict,
    study_name: str,
    storage: str,
    trials: int,
    timeout: float | None,
    base: TrainConfig,
    progress: bool = True,
) -> optuna.Study:
    sampler = optuna.samplers.TPESampler(seed=base.seed)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=10)
    study = optuna.create_study(
        study_name=study_name,
        storage=storage,
        direction="minimize",
        sampler=sampler,
        pruner=pruner,
        load_if_exists=True,
    )  # same name: resume
    done = sum(t.state.is_finished() for t in study.trials)
    remaining = max(0, trials - done)
    if remaining:
        study.optimize(
            objective(ds, parts, base),
            n_trials=remaining,
            timeout=timeout,
            show_progress_bar=progress,
            gc_after_trial=True,
        )
    return study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default=SERVING_SPLIT)
    parser.add_argument("--trials", type=int, default=20, help="total trials in the study, counting resumed ones")
    parser.add_argument("--timeout", type=float, default=None, help="seconds for this invocation")
    parser.add_argument("--max-epochs", type=int, default=60)
    parser.add_argument("--storage", default=os.environ.get("OPTUNA_STORAGE", DEFAULT_STORAGE))
    parser.add_argument("--study", default=None, help="default: gnn-<split>")
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "tuning.json"))
    args = parser.parse_args()

    setup()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ds = PlanGraphs()
    parts = named_splits(ds.meta)[args.split]
    name = args.study or f"gnn-{args.split.replace('/', '-')}"
    base = replace(TrainConfig(), max_epochs=args.max_epochs, members=1)
    with mlflow.start_run(run_name=f"tune {name}"):
        mlflow.log_params(
            {
                "study": name,
                "split": args.split,
                "storage": args.storage.split("://")[0],
                "dataset_version": dataset_version(ds.runs),
                "max_epochs": args.max_epochs,
            }
        )
        study = tune(ds, parts, name, args.storage, args.trials, args.timeout, base)
        mlflow.log_metric("best_val_selection", study.best_value)
        mlflow.log_params({f"best_{k}": v for k, v in study.best_params.items()})
    states = [t.state.name for t in study.trials]
    summary = {
        "study": name,
        "split": args.split,
        "trials": len(states),
        "complete": states.count("COMPLETE"),
        "pruned": states.count("PRUNED"),
        "best_value": study.best_value,
        "best_params": study.best_params,
    }
    Path(args.out).write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
