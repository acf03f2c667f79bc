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
import gc
import multiprocessing
import multiprocessing.connection
import os
import queue
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from concurrent.futures import Future, ProcessPoolExecutor, wait as futures_wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from collect.hardware import load_hardware
from collect.schema import Cluster, Plan, RunSpec, Workload
from gnn import checkpoint
from gnn.featurize import featurize_arrays
from gnn.ensemble import Ensemble
from gnn.fused import Packed, pack_arrays
from gnn.hardware_model import hardware_model
from gnn.rows import row_to_spec

KNOWN = {"vocab_known": True, "dtype_known": True, "sharding_known": True}
PARALLEL_FROM = 512  # below this many plans a process pool costs more than it saves
CHUNK = 64  # plans per unit of work: workers featurise chunks while the caller runs the model on earlier ones
QUEUED_PER_WORKER = 2  # chunks a worker holds ahead, so it never waits between chunks


RUNTIME = ("_pool", "_pool_size", "_workers_ready", "_lock", "_threads_users", "_threads_before")


def default_workers(n_plans: int) -> int:
    """Featurisation processes for a batch: none (inline) below PARALLEL_FROM plans, else all cores but the one
    the forward pass keeps."""
    return max(1, min((os.cpu_count() or 1) - 1, 8)) if n_plans >= PARALLEL_FROM else 0


@dataclass
class FeaturizedChunk:
    """A chunk of plans featurised: their graphs joined into one (gnn.fused.pack_arrays) and their flat features
    and simulator outputs as columns. A handful of arrays per chunk, not four per plan and a dict, is what makes
    a worker's reply cheap to send and the caller's forward pass cheap to start."""
    arrays: dict[str, np.ndarray]
    flat_names: tuple[str, ...]
    flat: np.ndarray  # [plans, flat_names]

    def packed(self) -> Packed:
        return Packed.from_arrays(self.arrays)

    def column(self, name: str) -> np.ndarray:
        return self.flat[:, self.flat_names.index(name)]

    def items(self) -> list[tuple]:
        """(graph, flat features) per plan."""
        return [(g, dict(zip(self.flat_names, row))) for g, row in zip(self.packed().graphs(), self.flat.tolist())]


def _featurize_chunk(args) -> FeaturizedChunk:
    specs, flags, hardware, hardware_dir = args
    hw, compilers = hardware_model(hardware, hardware_dir), {}  # plans of a chunk share passes
    graphs, flats = zip(*(featurize_arrays(spec, hw, f, compilers) for spec, f in zip(specs, flags)))
    names = tuple(flats[0])
    if any(tuple(f) != names for f in flats):
        raise ValueError("featurised plans disagree on their flat feature names")
    return FeaturizedChunk(pack_arrays(list(graphs)), names, np.array([list(f.values()) for f in flats], dtype=float))


WARM_UP_HARDWARE = "a100-80gb"  # a datasheet preset: shipped with the package, whatever data/hardware holds


def _warm_up_spec() -> RunSpec:
    """A small two-stage plan. Featurising it once loads the numba kernels' cached machine code (~0.3 s) and
    runs every stage of featurisation, which a service would otherwise pay in its first request."""
    return RunSpec(workload=Workload(layers=2, hidden=64, heads=2, seq_len=64, vocab=256, micro_batch_size=1,
                                     global_batch_size=8),
                   plan=Plan(pp=2, pp_schedule="1f1b", num_microbatches=8),
                   cluster=Cluster(devices_per_node=2, memory_bytes=2**30))


def _init_worker(hardware_dir: str) -> None:
    """A featurisation worker's start: end with its parent, warm up, and keep what it has loaded out of the
    garbage collector's full collections (gc.freeze: walking torch's objects took ~0.5 s each time)."""
    _exit_with_parent()
    _featurize_chunk(([_warm_up_spec()], [KNOWN], WARM_UP_HARDWARE, hardware_dir))
    gc.freeze()


def _exit_with_parent() -> None:
    """End this worker when the process that started the pool dies. Its task queue
    never reports the parent gone (the worker holds both ends of the pipe), so without this a service killed
    without running its exit handlers (SIGKILL, a crash) left each worker, ~600 MB, running for ever."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch():
        multiprocessing.connection.wait([parent.sentinel])  # readable once the parent has exited
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _ready(_) -> None:
    """A task that only makes a worker exist (and import this module)."""


class _Ends:
    """Indices 0..n-1 handed out from both ends, thread-safe: each exactly once."""

    def __init__(self, n: int):
        self.front, self.back, self._lock = 0, n, threading.Lock()

    def take_front(self) -> int | None:
        with self._lock:
            if self.front >= self.back:
                return None
            self.front += 1
            return self.front - 1

    def take_back(self) -> int | None:
        with self._lock:
            if self.front >= self.back:
                return None
            self.back -= 1
            return self.back


class Predictor:
    def __init__(self, ensemble: Ensemble, hardware_dir: str | Path = "data/hardware", info: dict | None = None):
        self.ensemble = ensemble.eval()
        self.hardware_dir = str(hardware_dir)
        self.info = info or {}  # which model: name, version, run id, validation metrics
        self.__setstate__(self.__dict__)

    def __getstate__(self):
        # a pool, its lock and the thread bookkeeping do not travel with the model
        return {k: v for k, v in self.__dict__.items() if k not in RUNTIME}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._pool, self._pool_size, self._workers_ready, self._lock = None, 0, 0, threading.Lock()
        self._threads_users, self._threads_before = 0, torch.get_num_threads()

    def start_workers(self, workers: int | None = None) -> None:
        """Start the featurisation processes now rather than on the first batch that needs them: each imports
        torch, which made a service's first 2,000-plan request take ~9 s instead of ~2.5 s."""
        workers = default_workers(PARALLEL_FROM) if workers is None else workers
        if workers:
            list(self._workers_pool(workers).map(_ready, range(workers)))
            self._workers_ready = workers

    def warm_up(self) -> None:
        """Featurise and predict one small plan in this process now (see _warm_up_spec), so that the first
        request does not pay for loading the compiled kernels."""
        self.predict_columns([_warm_up_spec()], WARM_UP_HARDWARE, workers=0)

    @property
    def workers_ready(self) -> int:
        """Featurisation processes known to be up (they have run a task)."""
        return self._workers_ready

    def _workers_pool(self, workers: int) -> ProcessPoolExecutor:
        with self._lock:  # the HTTP service calls from several threads
            return self._start_pool(workers)

    def _start_pool(self, workers: int) -> ProcessPoolExecutor:
        if self._pool is None or self._pool_size != workers:
            if self._pool is not None:
                self._pool.shutdown()
            self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"),
                                             initializer=_init_worker, initargs=(self.hardware_dir,))
            self._pool_size, self._workers_ready = workers, 0
            atexit.register(self._pool.shutdown)
        return self._pool

    def featurize(self, specs: list[RunSpec], hardware: str, flags: list[dict] | None = None,
                  workers: int | None = None):
        """(graph, flat features) per spec. ``flags`` mark assumed fields (rows.py); user plans state everything.
        ``workers``: featurisation processes, 0 to featurise inline, None for default_workers."""
        chunks = dict(self._featurized_chunks(specs, hardware, flags, workers))
        return [item for i in sorted(chunks) for item in chunks[i].items()]

    def _featurized_chunks(self, specs, hardware, flags, workers) -> Iterator[tuple[int, FeaturizedChunk]]:
        """(index, chunk) of CHUNK plans each, as they are ready (not in order), so the caller's forward pass
        overlaps the workers' featurisation of later chunks."""
        flags = flags or [KNOWN] * len(specs)
        workers = default_workers(len(specs)) if workers is None else workers
        chunks = [(specs[i:i + CHUNK], flags[i:i + CHUNK], hardware, self.hardware_dir)
                  for i in range(0, len(specs), CHUNK)]
        if not workers:
            yield from enumerate(map(_featurize_chunk, chunks))
            return
        yield from self._shared_chunks(chunks, workers)
        self._workers_ready = workers

    def _shared_chunks(self, chunks: list, workers: int) -> Iterator[tuple[int, FeaturizedChunk]]:
        """The workers take chunks from the front, the caller from the back. A feeder thread hands each worker
        its next chunk as soon as one returns: handed over by the caller between its own chunks and forward
        passes, the worker sat idle ~30% of the time. The caller featurises a chunk itself whenever none is
        ready, and waits only once every chunk is taken."""
        ends, ready, stop = _Ends(len(chunks)), queue.SimpleQueue(), threading.Event()
        pool = self._workers_pool(workers)

        def feed():
            in_flight = deque()
            try:
                while True:
                    while not stop.is_set() and len(in_flight) < QUEUED_PER_WORKER * workers and (
                            index := ends.take_front()) is not None:
                        in_flight.append((index, pool.submit(_featurize_chunk, chunks[index])))
                    if not in_flight:
                        return
                    index, future = in_flight.popleft()
                    futures_wait([future])
                    ready.put((index, future))  # done or failed: the caller raises its exception
            except BaseException as e:  # a broken pool: the caller raises it rather than wait for ever
                failed = Future()
                failed.set_exception(e)
                ready.put((-1, failed))

        threading.Thread(target=feed, name="featurisation-feeder", daemon=True).start()
        try:
            for _ in range(len(chunks)):
                try:
                    index, future = ready.get_nowait()
                except queue.Empty:
                    index = ends.take_back()
                    if index is not None:
                        yield index, _featurize_chunk(chunks[index])
                        continue
                    index, future = ready.get()
                yield index, future.result()
        finally:
            stop.set()  # an abandoned call hands out no more chunks

    @contextmanager
    def _forward_threads(self, workers: int):
        """While pool workers featurise, the forward pass keeps to the cores they leave: on 2 cores, one worker
        and a one-thread forward ran 245-284 plans/s, against 155-239 inline and 194-206 with two threads
        fighting the worker. Counted, so overlapping calls from the service's threads restore it once."""
        if not workers:
            yield
            return
        with self._lock:
            if self._threads_users == 0:
                self._threads_before = torch.get_num_threads()
                torch.set_num_threads(max(1, (os.cpu_count() or 1) - workers))
            self._threads_users += 1
        try:
            yield
        finally:
            with self._lock:
                self._threads_users -= 1
                if self._threads_users == 0:
                    torch.set_num_threads(self._threads_before)

    def predict(self, specs: list[RunSpec], hardware: str, flags: list[dict] | None = None,
                workers: int | None = None) -> pd.DataFrame:
        """One row per spec, in order: point predictions, 80% intervals, fits, and the simulator's breakdown."""
        return pd.DataFrame(self.predict_columns(specs, hardware, flags, workers))

    def predict_columns(self, specs: list[RunSpec], hardware: str, flags: list[dict] | None = None,
                        workers: int | None = None) -> dict[str, np.ndarray]:
        """predict() as a dict of columns: what the service uses, since a DataFrame costs ~ms per small request."""
        load_hardware(hardware, self.hardware_dir)  # an unknown name fails here, in the caller, not in a worker
        parts = {}
        workers = default_workers(len(specs)) if workers is None else workers
        with self._forward_threads(workers):
            for index, chunk in self._featurized_chunks(specs, hardware, flags, workers):
                parts[index] = (self.ensemble.predict_packed(chunk.packed()), chunk)
        parts = [parts[i] for i in sorted(parts)]
        out = ({k: np.concatenate([p[k] for p, _ in parts]) for k in parts[0][0]} if parts
               else self.ensemble.predict([]))
        capacity = np.array([s.cluster.memory_bytes for s in specs], dtype=float)
        out["memory_bytes"] = capacity
        out["fits"] = out["peak_mem_bytes"] <= capacity
        sim = {k: np.concatenate([chunk.column(k) for _, chunk in parts]) if parts else np.zeros(0)
               for k in ("sim_time_s", "sim_compute_s", "sim_bubble_s", "sim_exposed_s", "sim_comm_s")}
        # where the time goes, per the simulator on the busiest rank (fractions of its iteration)
        total = sim["sim_time_s"]
        out["compute_frac"] = np.minimum(sim["sim_compute_s"] / total, 1.0)
        out["bubble_frac"] = sim["sim_bubble_s"] / total
        out["exposed_frac"] = sim["sim_exposed_s"] / total
        out["comm_s_at_full_bandwidth"] = sim["sim_comm_s"]
        return out

    def predict_rows(self, rows: pd.DataFrame) -> pd.DataFrame:
        """Predictions for rows in the data/runs format (each row names its hardware)."""
        out = []
        for hardware, group in rows.groupby(rows["fingerprint_id"].fillna("a100-80gb"), sort=False):
            parsed = [row_to_spec(r) for r in group.to_dict("records")]
            specs, flags = [p[0] for p in parsed], [p[2] for p in parsed]
            out.append(self.predict(specs, hardware, flags).set_index(group.index))
        return pd.concat(out).loc[rows.index] if out else pd.DataFrame()

    def save(self, path: str | Path) -> None:
        """Weights plus a JSON description (gnn.checkpoint): loading runs no code from the file."""
        checkpoint.save(path, self.ensemble, self.info)

    @classmethod
    def load(cls, path: str | Path, hardware_dir: str | Path = "data/hardware") -> "Predictor":
        ensemble, info = checkpoint.load(path)
        return cls(ensemble, hardware_dir, info)
