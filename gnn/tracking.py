"""MLflow, in one place. Embedded default: sqlite:///mlflow.db in the repo root.

Set MLFLOW_TRACKING_URI to use a team server. Open the local UI with
``.venv/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db``.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import mlflow

REPO = Path(__file__).resolve().parents[1]
MODEL_NAME = "plansight"
CHAMPION = "champion"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI", f"sqlite:///{REPO / 'mlflow.db'}")


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


def register_if_better(model_uri: str, metric: str, value: float) -> bool:
    """Register the model and make it champion only if it beats the current one (lower is better)."""
    current = champion_metric(metric)
    if current is not None and value >= current:
        return False
    version = mlflow.register_model(model_uri, MODEL_NAME)
    mlflow.MlflowClient().set_registered_model_alias(MODEL_NAME, CHAMPION, version.version)
    return True
