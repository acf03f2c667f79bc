"""A training run in MLflow: its parameters, metrics, plots (predicted vs measured, the picture people look at
before the table) and model. Embedded default: sqlite:///mlflow.db in the repo root.

Set MLFLOW_TRACKING_URI to use a team server. Open the local UI with
``.venv/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import urllib.request
from pathlib import Path

import matplotlib
import mlflow
import numpy as np
import pandas as pd

from gnn.dataset.features import EDGE_DIM, NODE_FEATURES
from gnn.dataset.splits import SERVING_SPLIT
from gnn.graph.table import EDGE_KINDS
from gnn.inference.coverage import training_range
from gnn.inference.predictor import BatchPredictor
from gnn.tracking.model_cache import tracking_uri
from gnn.tracking.pyfunc import log_model
from gnn.tracking.registry import champion_selection_now, register
from gnn.tracking.scoring import ensemble_records, metrics_of, selection_value

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


class TrackingUnavailable(RuntimeError):
    """The MLflow tracking server does not answer (stopped, or unreachable); the message says which, in one line."""


# MLflow retries a request 7 times with doubling waits (minutes in all) before it gives up on a server that is
# down; three tries say so within seconds. A user's own setting wins.
HTTP_RETRIES = "3"


def setup(experiment: str = "plansight") -> None:
    uri = tracking_uri()
    if _remote(uri):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", HTTP_RETRIES)
    mlflow.set_tracking_uri(uri)
    with answering():
        mlflow.set_experiment(experiment)


@contextlib.contextmanager
def answering():
    """Raise TrackingUnavailable, naming the server and the cause, when a tracking call fails because its HTTP server
    does not answer; any other failure (or a local store's) is raised as it is."""
    try:
        yield
    except (mlflow.exceptions.MlflowException, OSError) as exc:
        uri = tracking_uri()
        if not _remote(uri) or _answers(uri):
            raise
        cause = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise TrackingUnavailable(f"the MLflow tracking server at {uri} does not answer ({cause})") from None


def _remote(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def _answers(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def dataset_version(paths) -> str:
    """Hash of the Parquet files a model was trained on."""
    h = hashlib.sha256()
    for p in sorted(map(Path, paths)):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def log_surrogate(
    ensemble,
    ds,
    parts: dict,
    split: str,
    params: dict,
    train_seconds: float,
    register: bool | None = None,
    recalibrated: bool = False,
) -> str:
    """One MLflow run: params, dataset version, metrics per part / domain / target, plots, tables, the model.

    Registered as a version, and aliased champion only if it beats the champion on validation; by default only
    models trained on the serving split are registered, since another split's validation rows are not comparable.
    """
    register = split == SERVING_SPLIT if register is None else register
    records, frames = ensemble_records(ensemble, ds, parts, split)
    value = selection_value(records)
    with mlflow.start_run(run_name=f"gnn {split}") as run, tempfile.TemporaryDirectory() as tmp:
        mlflow.log_params(
            {
                **params,
                "split": split,
                "dataset_version": dataset_version(ds.runs),
                "feature_version": ds.key,
                **{f"n_{k}": len(v) for k, v in parts.items()},
            }
        )
        mlflow.log_metrics(
            {
                **metrics_of(records),
                "val_selection": value,
                "train_seconds": train_seconds,
                **{
                    f"k_{d}_{t}": float(ensemble.k[i, j])
                    for i, d in enumerate(("cpu", "cuda"))
                    for j, t in enumerate(("time", "mem"))
                },
                **{  # each hardware domain's own factor, where it has one (gnn.model.ensemble)
                    f"k_domain_{d}_{t}": float(ensemble.k_domain[i, j])
                    for i, d in enumerate(ensemble.domain_names)
                    for j, t in enumerate(("time", "mem"))
                },
            }
        )
        for part, (rows, pred) in frames.items():
            mlflow.log_artifact(str(scatter(rows, pred, f"{split} {part} rows", f"{tmp}/scatter_{part}.png")), "plots")
        table = pd.DataFrame(records)
        table.to_csv(f"{tmp}/errors.csv", index=False)
        mlflow.log_artifact(f"{tmp}/errors.csv")
        mlflow.log_text(table.to_markdown(index=False, floatfmt=".4f"), "errors.md")
        mlflow.log_dict(
            {
                "node_features": list(NODE_FEATURES),
                "edge_features": list(EDGE_KINDS),
                "edge_dim": EDGE_DIM,
                "graph_features": [c for c in ds.meta.columns if c.startswith("f_")],
                "targets": ["log iter_time_s", "log peak_mem_bytes", "oom logit"],
            },
            "feature_schema.json",
        )
        predictor = BatchPredictor(
            ensemble,
            ds.hardware_dir,
            {
                "run_id": run.info.run_id,
                "split": split,
                "val_selection": value,
                "trained_range": training_range(ds.meta.loc[parts["train"]]),
            },
        )
        info = log_model(predictor, ds.meta.loc[parts["val"][:2]])
        champion = register and _register(info.model_uri, value, ds, parts, split, recalibrated)
    # a domain without the target (a fake trace has no time) has no MAPE to print
    scored = [r for r in records if r["part"] == "test" and r.get("mape") is not None]
    test_time = {r["domain"]: r["mape"] for r in scored if r["target"] == "time"}
    test_mem = {r["domain"]: r["mape"] for r in scored if r["target"] == "memory"}
    return (
        f"{split}: validation selection metric {value:.4f}; test time MAPE "
        + ", ".join(f"{d} {v:.1%}" for d, v in test_time.items())
        + "; test memory MAPE "
        + ", ".join(f"{d} {v:.1%}" for d, v in test_mem.items())
        + f"; run {run.info.run_id}; "
        + ("not registered" if not register else "registered as champion" if champion else "registered, not champion")
    )


def _register(model_uri: str, value: float, ds, parts: dict, split: str, recalibrated: bool) -> bool:
    current = champion_selection_now(ds, parts, split)
    return register(model_uri, "val_selection", value, ds.key, allow_equal=recalibrated, current=current)


TARGETS = (
    ("iter_time_s", "pred_time_s", "iteration time (s)"),
    ("peak_mem_bytes", "pred_mem_bytes", "peak memory (B)"),
)


def scatter(rows: pd.DataFrame, pred: pd.DataFrame, title: str, path: str | Path) -> Path:
    """Log-log predicted vs measured, one panel per target, with the +-10% band."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, (true_col, pred_col, label) in zip(axes, TARGETS):
        true, est = rows[true_col].to_numpy(dtype=float), pred[pred_col].to_numpy(dtype=float)
        ok = np.isfinite(true) & np.isfinite(est) & (true > 0)
        if not ok.any():
            ax.set_visible(False)
            continue
        oom = (rows["status"] == "oom").to_numpy()[ok]
        ax.scatter(true[ok][~oom], est[ok][~oom], s=6, alpha=0.5, label="ok")
        ax.scatter(true[ok][oom], est[ok][oom], s=6, alpha=0.5, c="tab:red", label="oom")
        lo, hi = min(true[ok].min(), est[ok].min()), max(true[ok].max(), est[ok].max())
        line = np.array([lo, hi])
        ax.plot(line, line, "k-", lw=0.8)
        ax.fill_between(line, line * 0.9, line * 1.1, color="grey", alpha=0.2, label="+-10%")
        ape = np.abs(est[ok] / true[ok] - 1)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel=f"measured {label}",
            ylabel=f"predicted {label}",
            title=f"MAPE {ape.mean():.1%}, median {np.median(ape):.1%}, n={ok.sum()}",
        )
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
