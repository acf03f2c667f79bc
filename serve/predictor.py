"""Load a trained surrogate by MLflow model URI or local path, and answer typed prediction requests.

    from serve.predictor import load_predictor, predict
    predictor = load_predictor("models:/plansight@champion")      # or a path to a saved predictor.pt
    predict(predictor, PredictRequest(workload=..., cluster=..., plans=[...]))
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from collect.hardware import default_hardware_dir
from gnn import model_cache
from gnn.predictor import Predictor
from serve.schemas import PlanPrediction, PredictRequest, PredictResponse


def load_predictor(source: str) -> Predictor:
    """A local predictor.pt, or any MLflow model URI (models:/name@alias, models:/name/3, runs:/id/model)."""
    if Path(source).is_file():
        return Predictor.load(source, default_hardware_dir())
    cached = model_cache.lookup(source)  # the registry unchanged since last time: no MLflow import at all
    if cached is None:
        cached = _resolve(source)
    local, info = cached
    predictor = Predictor.load(local / "artifacts" / "predictor.pt",
                               # fingerprints collected after training are as usable as those bundled with it
                               os.pathsep.join([str(default_hardware_dir()), str(local / "artifacts" / "hardware")]))
    predictor.info = {**predictor.info, **info}
    return predictor


def _resolve(source: str) -> tuple[Path, dict]:
    """Ask the registry which model ``source`` names, copy it locally once, and remember the answer."""
    import mlflow

    from gnn.tracking import cached_copy, setup

    setup()
    try:
        info = _registry_info(source)
        local = cached_copy(source, info.pop("source", None))
    except mlflow.exceptions.MlflowException as e:
        raise ValueError(f"model {source!r}: {e.message.splitlines()[0]} (train one with `make train`)") from None
    model_cache.remember(source, local.name, info)
    return local, info


def _registry_info(uri: str) -> dict:
    """Name, version and validation metrics of a registered model URI (models:/name@alias or models:/name/N)."""
    import mlflow

    if not uri.startswith("models:/"):
        return {"uri": uri}
    client = mlflow.MlflowClient()
    ref = uri[len("models:/"):]
    if "@" in ref:
        name, alias = ref.split("@", 1)
        version = client.get_model_version_by_alias(name, alias)
    else:
        name, number = ref.split("/", 1)
        version = client.get_model_version(name, number)
    metrics = client.get_run(version.run_id).data.metrics
    keep = {k: v for k, v in metrics.items() if k.startswith("val_") or k.startswith("test_")}
    return {"uri": uri, "name": name, "version": int(version.version), "run_id": version.run_id, "metrics": keep,
            "source": f"{version.source}@{version.run_id}"}


def predict(predictor: Predictor, request: PredictRequest) -> PredictResponse:
    columns = predictor.predict_columns(request.specs(), request.cluster.hardware_name())
    return PredictResponse(model=model_summary(predictor), predictions=predictions(columns))


def predictions(columns: dict[str, np.ndarray]) -> list[PlanPrediction]:
    """Predictor.predict_columns as the service's typed predictions. Column by column: converting each value
    of a row on its own (a dict per row, np.clip per share) cost 40 us a plan, 4x this."""
    values = [columns[k].tolist() for k in ("iter_time_s", "iter_time_lo_s", "iter_time_hi_s", "peak_mem_bytes",
                                            "peak_mem_lo_bytes", "peak_mem_hi_bytes", "fits", "oom_prob")]
    shares = [np.clip(columns[k], 0.0, 1.0).tolist() for k in ("compute_frac", "exposed_frac", "bubble_frac")]
    return [PlanPrediction(iter_time_s=t, iter_time_interval_s=(t_lo, t_hi), peak_mem_bytes=m,
                           peak_mem_interval_bytes=(m_lo, m_hi), fits=bool(fits), oom_prob=oom,
                           breakdown={"compute": compute, "communication_exposed": exposed, "bubble": bubble})
            for t, t_lo, t_hi, m, m_lo, m_hi, fits, oom, compute, exposed, bubble in zip(*values, *shares)]


def model_summary(predictor: Predictor) -> dict:
    return {k: v for k, v in predictor.info.items() if k != "metrics"} | {
        "members": len(predictor.ensemble.members), "featurisation_workers_ready": predictor.workers_ready}
