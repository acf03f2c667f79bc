"""Batched prediction for plans: specs in, time / memory / fits / interval / breakdown out.

The one path every consumer takes (evaluation, the MLflow pyfunc model, the
CLI and HTTP service, the plan search): compile each plan's execution graph on
the named hardware, simulate it for the physics features, and run the
ensemble over the batch. Featurisation is the expensive part, so large
batches run it on a process pool. The pool is started once per Predictor and
kept: starting workers costs seconds (they import torch). Workers come from a
forkserver, not fork: forking a process whose torch and server threads are
running can deadlock the child.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from collect.schema import RunSpec
from gnn.dataset import featurize_spec
from gnn.ensemble import Ensemble
from gnn.hardware_model import hardware_model
from gnn.rows import row_to_spec

KNOWN = {"vocab_known": True, "dtype_known": True, "sharding_known": True}
PARALLEL_FROM = 512  # below this many plans a process pool costs more than it saves


def _featurize_chunk(args):
    specs, flags, hardware, hardware_dir = args
    hw = hardware_model(hardware, hardware_dir)
    return [featurize_spec(spec, hw, f) for spec, f in zip(specs, flags)]


class Predictor:
    def __init__(self, ensemble: Ensemble, hardware_dir: str | Path = "data/hardware", info: dict | None = None):
        self.ensemble = ensemble.eval()
        self.hardware_dir = str(hardware_dir)
        self.info = info or {}  # which model: name, version, run id, validation metrics
        self.__setstate__(self.__dict__)

    def __getstate__(self):
        # a pool and its lock do not travel with the model
        return {k: v for k, v in self.__dict__.items() if k not in ("_pool", "_pool_size", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._pool, self._pool_size, self._lock = None, 0, threading.Lock()

    def _workers_pool(self, workers: int) -> ProcessPoolExecutor:
        with self._lock:  # the HTTP service calls from several threads
            return self._start_pool(workers)

    def _start_pool(self, workers: int) -> ProcessPoolExecutor:
        if self._pool is None or self._pool_size != workers:
            if self._pool is not None:
                self._pool.shutdown()
            self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"))
            self._pool_size = workers
            atexit.register(self._pool.shutdown)
        return self._pool

    def featurize(self, specs: list[RunSpec], hardware: str, flags: list[dict] | None = None,
                  workers: int | None = None):
        """(graph, flat features) per spec. ``flags`` mark assumed fields (rows.py); user plans state everything."""
        flags = flags or [KNOWN] * len(specs)
        if workers is None:
            workers = min(os.cpu_count() or 1, 8) if len(specs) >= PARALLEL_FROM else 1
        if workers <= 1:
            return _featurize_chunk((specs, flags, hardware, self.hardware_dir))
        chunks = [(specs[i::workers], flags[i::workers], hardware, self.hardware_dir) for i in range(workers)]
        parts = list(self._workers_pool(workers).map(_featurize_chunk, chunks))
        out = [None] * len(specs)
        for i, part in enumerate(parts):
            out[i::workers] = part
        return out

    def predict(self, specs: list[RunSpec], hardware: str, flags: list[dict] | None = None,
                workers: int | None = None) -> pd.DataFrame:
        """One row per spec, in order: point predictions, 80% intervals, fits, and the simulator's breakdown."""
        featurized = self.featurize(specs, hardware, flags, workers)
        graphs = [data for data, _ in featurized]
        with torch.no_grad():
            pred = pd.DataFrame(self.ensemble.predict(graphs))
        capacity = np.array([s.cluster.memory_bytes for s in specs], dtype=float)
        pred["memory_bytes"] = capacity
        pred["fits"] = pred["peak_mem_bytes"] <= capacity
        flat = pd.DataFrame([f for _, f in featurized])
        if len(flat):
            # where the time goes, per the simulator on the busiest rank (fractions of its iteration)
            total = flat["sim_time_s"].to_numpy()
            pred["compute_frac"] = np.minimum(flat["sim_compute_s"].to_numpy() / total, 1.0)
            pred["bubble_frac"] = flat["sim_bubble_s"].to_numpy() / total
            pred["exposed_frac"] = flat["sim_exposed_s"].to_numpy() / total
            pred["comm_s_at_full_bandwidth"] = flat["sim_comm_s"].to_numpy()
        return pred

    def predict_rows(self, rows: pd.DataFrame) -> pd.DataFrame:
        """Predictions for rows in the data/runs format (each row names its hardware)."""
        out = []
        for hardware, group in rows.groupby(rows["fingerprint_id"].fillna("a100-80gb"), sort=False):
            parsed = [row_to_spec(r) for r in group.to_dict("records")]
            specs, flags = [p[0] for p in parsed], [p[2] for p in parsed]
            out.append(self.predict(specs, hardware, flags).set_index(group.index))
        return pd.concat(out).loc[rows.index] if out else pd.DataFrame()

    def save(self, path: str | Path) -> None:
        torch.save({"ensemble": self.ensemble, "info": self.info}, path)

    @classmethod
    def load(cls, path: str | Path, hardware_dir: str | Path = "data/hardware") -> "Predictor":
        blob = torch.load(path, weights_only=False)  # our own pickled modules
        return cls(blob["ensemble"], hardware_dir, blob["info"])
