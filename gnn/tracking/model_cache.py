"""A trained model by path or MLflow model URI, and which local copy a URI names, remembered without MLflow:
a command-line prediction through the registry then costs no MLflow import (~3 s: the package and its
store's start-up) while the registry is unchanged.

A resolution (models:/plansight@champion -> the copy in build/models/<key>) is remembered with the size and
modification time of the local sqlite store it was read from. Any change to the registry writes that file, so
a matching stat means the alias still names the same version. Remote tracking servers are always asked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from collect import REPO
from collect.hardware.records import default_hardware_dir
from gnn.inference.predictor import BatchPredictor

MODEL_CACHE = REPO / "build" / "models"
INDEX = MODEL_CACHE / "resolved.json"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI", f"sqlite:///{REPO / 'mlflow.db'}")


def _store_stat() -> list[int] | None:
    uri = tracking_uri()
    if not uri.startswith("sqlite:///"):
        return None
    try:
        stat = Path(uri[len("sqlite:///") :]).stat()
    except OSError:
        return None
    return [stat.st_size, stat.st_mtime_ns]


def lookup(uri: str) -> tuple[Path, dict] | None:
    """(local model folder, registry info) if ``uri`` was resolved against this very store state."""
    stat = _store_stat()
    if stat is None or not INDEX.is_file():
        return None
    try:
        entry = json.loads(INDEX.read_text()).get(f"{tracking_uri()}|{uri}")
    except (OSError, ValueError):
        return None
    if not entry or entry.get("store") != stat:
        return None
    local = MODEL_CACHE / entry["key"]
    return (local, entry["info"]) if (local / "artifacts" / "predictor.pt").is_file() else None


def remember(uri: str, key: str, info: dict) -> None:
    stat = _store_stat()
    if stat is None:
        return
    try:
        index = json.loads(INDEX.read_text()) if INDEX.is_file() else {}
    except (OSError, ValueError):
        index = {}
    index[f"{tracking_uri()}|{uri}"] = {"store": stat, "key": key, "info": info}
    tmp = INDEX.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(index))
    os.replace(tmp, INDEX)


def load_model(source: str) -> BatchPredictor:
    """A local predictor.pt, or any MLflow model URI (models:/name@alias, models:/name/3, runs:/id/model)."""
    if Path(source).is_file():
        return BatchPredictor.load(source, default_hardware_dir())
    cached = lookup(source)  # the registry unchanged since last time: no MLflow import at all
    if cached is None:
        cached = _resolve(source)
    local, info = cached
    predictor = BatchPredictor.load(
        local / "artifacts" / "predictor.pt",
        # fingerprints collected after training are as usable as those bundled with it
        os.pathsep.join([str(default_hardware_dir()), str(local / "artifacts" / "hardware")]),
    )
    predictor.info = {**predictor.info, **info}
    return predictor


def _resolve(source: str) -> tuple[Path, dict]:
    """Ask the registry which model ``source`` names, copy it locally once, and remember the answer."""
    import mlflow  # lazy: a prediction through an unchanged registry (lookup) never imports MLflow (~3 s)

    mlflow.set_tracking_uri(tracking_uri())
    try:
        info = registry_info(source)
        local = cached_copy(source, info.pop("source", None))
    except mlflow.exceptions.MlflowException as e:
        raise ValueError(f"model {source!r}: {e.message.splitlines()[0]} (train one with `make train`)") from None
    remember(source, local.name, info)
    return local, info


def registry_info(uri: str) -> dict:
    """Name, version and validation metrics of a registered model URI (models:/name@alias or models:/name/N)."""
    import mlflow  # lazy: as in _resolve

    if not uri.startswith("models:/"):
        return {"uri": uri}
    client = mlflow.MlflowClient()
    ref = uri[len("models:/") :]
    if "@" in ref:
        name, alias = ref.split("@", 1)
        version = client.get_model_version_by_alias(name, alias)
    else:
        name, number = ref.split("/", 1)
        version = client.get_model_version(name, number)
    metrics = client.get_run(version.run_id).data.metrics
    keep = {k: v for k, v in metrics.items() if k.startswith("val_") or k.startswith("test_")}
    return {
        "uri": uri,
        "name": name,
        "version": int(version.version),
        "run_id": version.run_id,
        "metrics": keep,
        "source": f"{version.source}@{version.run_id}",
    }


def cached_copy(uri: str, resolved: str | None = None) -> Path:
    """The local copy of a logged model's folder, made on first use (see load_registered)."""
    import mlflow  # lazy: a model file or a remembered resolution needs no MLflow

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
