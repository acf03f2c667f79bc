"""A pool of long-lived ranks that measure plans in turn (the local, CPU launcher).

Ranks are spawned once per world size, join one gloo process group, and then
run plan after plan: each plan builds its own mesh and sub-groups and frees them
after. A sweep so pays process start-up and ``import torch`` once, not per plan.
Any failing or late plan tears the pool down (a rank may be stuck in a
collective its peers never joined) and the next plan gets fresh processes.
"""

from __future__ import annotations

import datetime
import os
import queue
import socket
import tempfile
import time
import traceback
from pathlib import Path

import torch.multiprocessing as mp

from collect.launch.result import RankOutcome, RunResult, combine_ranks
from collect.measure import cpu_alloc
from collect.measure.plan import MeasureSettings
from collect.schema import RunSpec

START_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(
    rank: int, world_size: int, port: int, tasks, results, collective_timeout_s: float, log_path: str, core: int | None
) -> None:
    # The rank's own output (library warnings, the profiler's trace markers) goes to
    # its log file, so the parent's progress bar stays readable.
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    # One intra-op thread per rank: ranks share the machine's cores like GPUs don't.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if core is not None:  # a core of its own: no rank is moved or shares a core's caches mid-step
        os.sched_setaffinity(0, {core})
    # lazy: the measuring modules load after the redirect above, so what they print on import lands in the
    # rank's log; the parent never needs them
    import warnings

    import torch
    import torch.distributed as dist

    from collect.hardware.fingerprint import measure_fingerprint_on_rank
    from collect.measure import cpu_alloc, gloo_settle
    from collect.measure.plan import measure_on_rank

    # DTensor warns that its RNG is incomplete on CPU meshes; init values do not matter here.
    warnings.filterwarnings("ignore", message="DTensor random operators")
    torch.set_num_threads(1)
    gloo_settle.install()
    cpu_alloc.install()  # before gloo and the plans allocate: every CPU byte of theirs is counted
    dist.init_process_group(
        "gloo",
        rank=rank,
        world_size=world_size,
        init_method=f"tcp://127.0.0.1:{port}",
        timeout=datetime.timedelta(seconds=collective_timeout_s),
    )
    results.put(("ready", rank, None))
    device = torch.device("cpu")
    parent = os.getppid()
    while (task := _next_task(tasks, parent)) is not None:
        task_id, kind, payload = task
        try:
            if kind == "fingerprint":
                results.put((task_id, rank, RankOutcome(ok=True, extra=measure_fingerprint_on_rank(**payload))))
                continue
            spec = RunSpec.model_validate_json(payload["spec"])
            out = measure_on_rank(spec, device, MeasureSettings.model_validate_json(payload["settings"]))
            results.put((task_id, rank, RankOutcome(ok=True, **out)))
        except BaseException as exc:  # report everything; the parent decides
            oom = isinstance(exc, torch.OutOfMemoryError)  # a real device OOM is data, not an error
            results.put((task_id, rank, RankOutcome(ok=False, oom=oom, error=_describe(exc))))
            if not isinstance(exc, Exception):
                raise
    dist.destroy_process_group()


def _next_task(tasks, parent: int):
    """The next task, or None when told to stop or when the parent died (killed sweep)."""
    while True:
        try:
            return tasks.get(timeout=5.0)
        except queue.Empty:
            if os.getppid() != parent:
                return None


def _describe(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" at {last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno}" if last else ""
    return f"{type(exc).__name__}: {exc}{where}"[:2000]


class LocalPool:
    """``with LocalPool(world_size) as pool: result = pool.run(spec)``."""

    def __init__(self, world_size: int, settings: MeasureSettings | None = None, deadline_s: float = 300.0):
        self.world_size = world_size
        self.settings = settings or MeasureSettings()
        self.deadline_s = deadline_s
        self.restarts = 0
        self._procs: list = []
        self._task_id = 0
        self.log_dir = Path(tempfile.gettempdir()) / f"plansight-{os.getpid()}"

    def log_path(self, rank: int) -> Path:
        return self.log_dir / f"ws{self.world_size}-rank{rank}.log"

    def __enter__(self) -> "LocalPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        cpu_alloc.build()  # once here, so ranks only load it (a first build takes ~30 s)
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        port = _free_port()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        cores = sorted(os.sched_getaffinity(0))
        pin = self.settings.pin_cores and self.world_size <= len(cores)
        self._procs = [
            ctx.Process(
                target=_worker,
                daemon=True,
                name=f"plansight-rank{r}",
                args=(
                    r,
                    self.world_size,
                    port,
                    self._tasks[r],
                    self._results,
                    self.deadline_s,
                    str(self.log_path(r)),
                    cores[r] if pin else None,
                ),
            )
            for r in range(self.world_size)
        ]
        for p in self._procs:
            p.start()
        ready = self._collect("ready", START_TIMEOUT_S)
        if len(ready) != self.world_size:
            self.close()
            raise RuntimeError(f"only {len(ready)} of {self.world_size} ranks started within {START_TIMEOUT_S:.0f} s")

    def run(self, spec: RunSpec) -> RunResult:
        if spec.cluster.world_size != self.world_size:
            raise ValueError(f"spec needs {spec.cluster.world_size} ranks, pool has {self.world_size}")
        started = time.time()
        payload = {"spec": spec.model_dump_json(), "settings": self.settings.model_dump_json()}
        outcomes = self._submit("measure", payload, self.deadline_s)
        result = combine_ranks(spec, outcomes, self.world_size, self.deadline_s, time.time() - started)
        if result.status == "timeout":
            result.error += f"; rank output in {self.log_dir}"
        if result.status in ("error", "timeout"):
            self._restart()
        return result

    def fingerprint(self, **kwargs) -> list[dict]:
        """Run the collective benchmark on every rank; returns rank 0's timings."""
        outcomes = self._submit("fingerprint", kwargs, self.deadline_s * 4)
        if len(outcomes) != self.world_size or not all(o.ok for o in outcomes.values()):
            self._restart()
            errors = [o.error for o in outcomes.values() if not o.ok]
            raise RuntimeError(f"fingerprint on {self.world_size} ranks failed: {errors or 'timeout'}")
        return outcomes[0].extra

    def _submit(self, kind: str, payload: dict, timeout_s: float) -> dict[int, RankOutcome]:
        if not self._procs:
            self._start()
        self._task_id += 1
        for q in self._tasks:
            q.put((self._task_id, kind, payload))
        return self._collect(self._task_id, timeout_s)

    def _collect(self, task_id, timeout_s: float) -> dict[int, RankOutcome]:
        """Outcomes by rank for this task; stops early when a rank fails or dies."""
        got: dict[int, RankOutcome] = {}
        deadline = time.monotonic() + timeout_s
        while len(got) < self.world_size and time.monotonic() < deadline:
            try:
                tid, rank, outcome = self._results.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                if any(not p.is_alive() for p in self._procs):
                    break
                continue
            if tid == task_id:
                got[rank] = outcome
                if outcome is not None and not outcome.ok:
                    break  # peers may now hang in a collective; no point waiting
        return got

    def _restart(self) -> None:
        # A rank may be blocked in a collective its failed peer never joined: kill, don't ask.
        self.restarts += 1
        self.close(graceful=False)

    def close(self, graceful: bool = True) -> None:
        if graceful:
            for q in getattr(self, "_tasks", []):
                q.put(None)
        for p in self._procs:
            if graceful:
                p.join(timeout=5.0)
            if p.is_alive():
                p.kill()
            p.join(timeout=5.0)
        self._procs = []
