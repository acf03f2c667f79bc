"""MLflow, in one place. Embedded default: sqlite:///mlflow.db in the repo root.

Set MLFLOW_TRACKING_URI to use a team server. Open the local UI with
``.venv/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db``.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import mlflow

from gnn.model_cache import MODEL_CACHE, REPO, tracking_uri
MODEL_NAME = "plansight"
CHAMPION = "champion"


def setup(experiment: str = "plansight") -> None:
    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment(experiment)


def dataset_version(paths) -> str:
    """Hash of the Parquet files a model was trained on."""
    h = hashlib.sha256()
    for p in sorted(map(Path, paths)):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def champion_metric(metric: str) -> float | None:
    """The registered champion's value of ``metric``, or None if there is no champion."""
    client = mlflow.MlflowClient()
    try:
        version = client.get_model_version_by_alias(MODEL_NAME, CHAMPION)
    except mlflow.exceptions.MlflowException:
        return None
    return client.get_run(version.run_id).data.metrics.get(metric)


def champion_selection_now(ds, parts: dict, split: str) -> float | None:
    """The champion's validation selection metric under the current data and graph code (inf if it cannot read
    the current graphs).

    The recorded metric holds only while the features are computed as they were when the champion was
    trained (``feature_version``, the dataset's cache key over data and graph code). After a change to the
    graph code the champion is scored again on the same validation rows, so the comparison is like for like.
    """
    client = mlflow.MlflowClient()
    try:
        version = client.get_model_version_by_alias(MODEL_NAME, CHAMPION)
    except mlflow.exceptions.MlflowException:
        return None
    try:  # a copy is kept after the first time (build/models), so this costs little
        champion = load_registered(f"models:/{MODEL_NAME}@{CHAMPION}", f"{version.source}@{version.run_id}")
    except ValueError:  # saved as pickled modules, before models were weights: unreadable now, so replaced
        print(f"champion (version {version.version}) is in a format this code no longer reads; a new model replaces it")
        return float("inf")
    run = client.get_run(version.run_id)
    if run.data.params.get("feature_version") == ds.key:
        return run.data.metrics.get("val_selection")
    if _input_dims(champion.ensemble) != (ds.num_node_features, ds[0].u.shape[1]):
        # the graph's format changed (other features): this code can neither score nor serve it, so any model wins
        print(f"champion (version {version.version}) reads another graph format; a new model replaces it")
        return float("inf")
    records, _ = ensemble_records(champion.ensemble, ds, parts, split, which=("val",))
    value = selection_value(records)
    print(f"champion (version {version.version}) re-scored under the current features: {value:.4f} "
          f"(recorded {run.data.metrics.get('val_selection', float('nan')):.4f})")
    return value


def load_registered(uri: str, resolved: str | None = None):
    """The Predictor of a logged model (models:/name@alias, models:/name/N, runs:/id/model), from its artifacts:
    the weights file is loaded with weights_only and the pyfunc's pickle is never read. The artifacts are copied
    once into build/models/<resolved> (``resolved``: what the URI names now, e.g. the logged model id of the
    alias's version), so asking again costs no copy."""
    from gnn.predictor import Predictor

    local = cached_copy(uri, resolved)
    return Predictor.load(local / "artifacts" / "predictor.pt", local / "artifacts" / "hardware")


def cached_copy(uri: str, resolved: str | None = None) -> Path:
    """The local copy of a logged model's folder, made on first use (see load_registered)."""
    import shutil
    import tempfile

    key = hashlib.sha256((resolved or uri).encode()).hexdigest()[:16]
    local = MODEL_CACHE / key
    if not (local / "artifacts" / "predictor.pt").is_file():
        MODEL_CACHE.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=MODEL_CACHE, prefix=f".{key}-"))
        try:
            mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(staging))
            os.replace(staging, local) if not local.exists() else None  # another process may have won the race
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return local


def _input_dims(ensemble) -> tuple[int, int]:
    model = ensemble.members[0].model
    return model.node_norm.mean.numel(), model.global_norm.mean.numel()


def register_if_better(model_uri: str, metric: str, value: float, allow_equal: bool = False,
                       current: float | None = None) -> bool:
    """Register the model and make it champion only if it beats the current one (lower is better).

    ``allow_equal``: a re-calibrated copy of the champion (same predictions, new intervals) may replace it.
    ``current``: the champion's value if already known (re-scored), else its recorded ``metric``.
    """
    current = champion_metric(metric) if current is None else current
    if current is not None and (value > current or (value == current and not allow_equal)):
        return False
    version = mlflow.register_model(model_uri, MODEL_NAME)
    mlflow.MlflowClient().set_registered_model_alias(MODEL_NAME, CHAMPION, version.version)
    return True


def ensemble_records(ensemble, ds, parts: dict, split: str, predictor: str = "gnn",
                     which: tuple[str, ...] = ("val", "test")) -> tuple[list[dict], dict]:
    """Score records of the ensemble on parts of a split, per hardware domain; and the frames behind them."""
    import torch

    from gnn.scoring import ensemble_frame, score

    records, frames = [], {}
    for part in which:
        idx = parts[part]
        rows = ds.meta.loc[idx]
        pred = ensemble_frame(ensemble.predict(ds[torch.as_tensor(idx)]), rows.index)
        frames[part] = (rows, pred)
        for domain, group in rows.groupby("domain"):
            records += score(group, pred.loc[group.index], {"predictor": predictor, "domain": domain,
                                                             "split": split.split("/", 1)[1], "part": part})
    return records, frames


def _metrics(records: list[dict]) -> dict[str, float]:
    out = {}
    for r in records:
        for key in ("mape", "mdape", "p90", "coverage", "accuracy", "kendall_tau", "top1_success"):
            if r.get(key) is not None:
                out[f"{r['part']}_{r['domain']}_{r['target']}_{key}"] = r[key]
    return out


def selection_value(records: list[dict], part: str = "val") -> float:
    """The champion metric: mean over domains of time MAPE + memory MAPE on ``part``."""
    values = {}
    for r in records:
        if r["part"] == part and r["target"] in ("time", "memory") and r.get("mape") is not None:
            values.setdefault(r["domain"], 0.0)
            values[r["domain"]] += r["mape"]
    return sum(values.values()) / len(values)


def log_surrogate(ensemble, ds, parts: dict, split: str, params: dict, train_seconds: float,
                  register: bool | None = None, recalibrated: bool = False) -> str:
    """One MLflow run: params, dataset version, metrics per part / domain / target, plots, tables, the model.

    Registered (and aliased champion) only if it beats the champion on validation; by default only models
    trained on the serving split compete, since another split's validation rows are not comparable.
    """
    import tempfile

    import pandas as pd

    from gnn.features import EDGE_DIM, NODE_FEATURES
    from gnn.graph import EDGE_KINDS
    from gnn.plots import scatter
    from gnn.predictor import Predictor
    from gnn.splits import SERVING_SPLIT
    from serve.pyfunc import log_model

    register = split == SERVING_SPLIT if register is None else register
    records, frames = ensemble_records(ensemble, ds, parts, split)
    value = selection_value(records)
    with mlflow.start_run(run_name=f"gnn {split}") as run, tempfile.TemporaryDirectory() as tmp:
        mlflow.log_params({**params, "split": split, "dataset_version": dataset_version(ds.runs), "feature_version": ds.key,
                           **{f"n_{k}": len(v) for k, v in parts.items()}})
        mlflow.log_metrics({**_metrics(records), "val_selection": value, "train_seconds": train_seconds,
                            **{f"k_{d}_{t}": float(ensemble.k[i, j]) for i, d in enumerate(("cpu", "cuda"))
                               for j, t in enumerate(("time", "mem"))}})
        for part, (rows, pred) in frames.items():
            mlflow.log_artifact(str(scatter(rows, pred, f"{split} {part} rows", f"{tmp}/scatter_{part}.png")), "plots")
        table = pd.DataFrame(records)
        table.to_csv(f"{tmp}/errors.csv", index=False)
        mlflow.log_artifact(f"{tmp}/errors.csv")
        mlflow.log_text(table.to_markdown(index=False, floatfmt=".4f"), "errors.md")
        mlflow.log_dict({"node_features": list(NODE_FEATURES), "edge_features": list(EDGE_KINDS), "edge_dim": EDGE_DIM,
                         "graph_features": [c for c in ds.meta.columns if c.startswith("f_")],
                         "targets": ["log iter_time_s", "log peak_mem_bytes", "oom logit"]}, "feature_schema.json")
        predictor = Predictor(ensemble, ds.hardware_dir, {"run_id": run.info.run_id, "split": split,
                                                           "val_selection": value})
        info = log_model(predictor, ds.meta.loc[parts["val"][:2]])
        registered = register and register_if_better(info.model_uri, "val_selection", value, allow_equal=recalibrated,
                                                     current=champion_selection_now(ds, parts, split))
    test_time = {r["domain"]: r["mape"] for r in records if r["part"] == "test" and r["target"] == "time"}
    test_mem = {r["domain"]: r["mape"] for r in records if r["part"] == "test" and r["target"] == "memory"}
    return (f"{split}: validation selection metric {value:.4f}; test time MAPE "
            + ", ".join(f"{d} {v:.1%}" for d, v in test_time.items()) + "; test memory MAPE "
            + ", ".join(f"{d} {v:.1%}" for d, v in test_mem.items())
            + f"; run {run.info.run_id}; " + ("registered as champion" if registered else "not registered"))
