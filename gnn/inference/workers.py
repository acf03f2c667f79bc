"""Featurisation on a process pool, shared by every batch a BatchPredictor runs.

Featurisation (compile each plan's graph, simulate it) is the expensive part of a prediction, so large
batches run it in worker processes, CHUNK plans per unit of work, while the caller runs the model on the
chunks already done. The pool is started once and kept: starting workers costs seconds (they import
torch). Workers come from a forkserver, not fork: forking a process whose torch and server threads are
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
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import wait as futures_wait
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from collect.schema import Cluster, Plan, RunSpec, Workload
from gnn.costs.hardware import hardware_model
from gnn.dataset.featurize import featurize_arrays
from gnn.dataset.packed import Packed, pack_arrays
from gnn.inference.cost import CHUNK_BYTES, Cost, plan_cost

KNOWN = {"vocab_known": True, "dtype_known": True, "sharding_known": True}
PARALLEL_FROM = 512  # below this many plans a process pool costs more than it saves
# plans per unit of work (fewer where their graphs are big: chunk_bounds): workers featurise chunks while the caller
# runs the model on earlier ones
CHUNK = 64
QUEUED_PER_WORKER = 2  # chunks a worker holds ahead, so it never waits between chunks


def default_workers(n_plans: int) -> int:
    """Featurisation processes for a batch: none (inline) below PARALLEL_FROM plans, else all cores but the one
    the forward pass keeps."""
    return max(1, min((os.cpu_count() or 1) - 1, 8)) if n_plans >= PARALLEL_FROM else 0


@dataclass
class FeaturizedChunk:
    """A chunk of plans featurised: their graphs joined into one (gnn.dataset.packed.pack_arrays) and their flat
    features and simulator outputs as columns. A handful of arrays per chunk, not four per plan and a dict, is
    what makes a worker's reply cheap to send and the caller's forward pass cheap to start."""

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


def chunk_bounds(specs: list[RunSpec]) -> list[tuple[int, int]]:
    """[start, end) of each chunk: CHUNK plans, or fewer where their graphs would take more than CHUNK_BYTES
    (gnn.inference.cost), so a chunk of big graphs never holds CHUNK of them at once."""
    bounds, start, cost = [], 0, Cost()
    for i, spec in enumerate(specs):
        step = plan_cost(spec.plan)
        if i > start and (i - start == CHUNK or (cost + step).chunk_bytes > CHUNK_BYTES):
            bounds.append((start, i))
            start, cost = i, Cost()
        cost = cost + step
    return bounds + ([(start, len(specs))] if specs else [])


def _featurize_chunk(args) -> FeaturizedChunk:
    specs, flags, hardware, hardware_dir = args
    hw, compilers = hardware_model(hardware, hardware_dir), {}  # plans of a chunk share passes
    graphs, flats = zip(*(featurize_arrays(spec, hw, f, compilers) for spec, f in zip(specs, flags)))
    names = tuple(flats[0])
    if any(tuple(f) != names for f in flats):
        raise ValueError("featurised plans disagree on their flat feature names")
    return FeaturizedChunk(pack_arrays(list(graphs)), names, np.array([list(f.values()) for f in flats], dtype=float))


WARM_UP_HARDWARE = "a100-80gb"  # a datasheet preset: shipped with the package, whatever data/hardware holds


def warm_up_spec() -> RunSpec:
    """A small two-stage plan. Featurising it once loads the numba kernels' cached machine code (~0.3 s) and
    runs every stage of featurisation, which a service would otherwise pay in its first request."""
    return RunSpec(
        workload=Workload(layers=2, hidden=64, heads=2, seq_len=64, vocab=256, micro_batch_size=1, global_batch_size=8),
        plan=Plan(pp=2, pp_schedule="1f1b", num_microbatches=8),
        cluster=Cluster(devices_per_node=2, memory_bytes=2**30),
    )


def _init_worker(hardware_dir: str) -> None:
    """A featurisation worker's start: end with its parent, warm up, and keep what it has loaded out of the
    garbage collector's full collections (gc.freeze: walking torch's objects took ~0.5 s each time)."""
    _exit_with_parent()
    _featurize_chunk(([warm_up_spec()], [KNOWN], WARM_UP_HARDWARE, hardware_dir))
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


class FeaturizerPool:
    """The featurisation processes of one predictor, and the forward pass's share of the cores while they
    run. Thread-safe: the HTTP service calls from several threads."""

    def __init__(self, hardware_dir: str):
        self.hardware_dir = hardware_dir
        self._pool, self._pool_size, self._workers_ready, self._lock = None, 0, 0, threading.Lock()
        self._threads_users, self._threads_before = 0, torch.get_num_threads()

    def start_workers(self, workers: int | None = None) -> None:
        """Start the featurisation processes now rather than on the first batch that needs them: each imports
        torch, which made a service's first 2,000-plan request take ~9 s instead of ~2.5 s."""
        workers = default_workers(PARALLEL_FROM) if workers is None else workers
        if workers:
            list(self._workers_pool(workers).map(_ready, range(workers)))
            self._workers_ready = workers

    @property
    def workers_ready(self) -> int:
        """Featurisation processes known to be up (they have run a task)."""
        return self._workers_ready

    def _workers_pool(self, workers: int) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None or self._pool_size != workers:
                if self._pool is not None:
                    self._pool.shutdown()
                self._pool = ProcessPoolExecutor(
                    workers,
                    mp_context=multiprocessing.get_context("forkserver"),
                    initializer=_init_worker,
                    initargs=(self.hardware_dir,),
                )
                self._pool_size, self._workers_ready = workers, 0
                atexit.register(self._pool.shutdown)
            return self._pool

    def chunks(self, specs, hardware, flags, workers) -> Iterator[tuple[int, FeaturizedChunk]]:
        """(index, chunk) of CHUNK plans each, as they are ready (not in order), so the caller's forward pass
        overlaps the workers' featurisation of later chunks. ``workers``: 0 featurises inline."""
        flags = flags or [KNOWN] * len(specs)
        chunks = [(specs[a:b], flags[a:b], hardware, self.hardware_dir) for a, b in chunk_bounds(specs)]
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
                    while (
                        not stop.is_set()
                        and len(in_flight) < QUEUED_PER_WORKER * workers
                        and (index := ends.take_front()) is not None
                    ):
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
    def forward_threads(self, workers: int):
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
