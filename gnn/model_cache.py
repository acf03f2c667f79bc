"""Which local copy a model URI names, remembered without MLflow: a command-line prediction through the registry
then costs no MLflow import (~3 s: the package and its store's start-up) while the registry is unchanged.

A resolution (models:/plansight@champion -> the copy in build/models/<key>) is remembered with the size and
modification time of the local sqlite store it was read from. Any change to the registry writes that file, so
a matching stat means the alias still names the same version. Remote tracking servers are always asked.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL_CACHE = REPO / "build" / "models"
INDEX = MODEL_CACHE / "resolved.json"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI", f"sqlite:///{REPO / 'mlflow.db'}")


def _store_stat() -> list[int] | None:
    uri = tracking_uri()
    if not uri.startswith("sqlite:///"):
        return None
    try:
        stat = Path(uri[len("sqlite:///"):]).stat()
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
