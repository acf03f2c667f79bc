"""Run a sweep under torchrun: GPU clusters (NCCL, one process per GPU, multi-node).

    torchrun --nproc_per_node 8 --nnodes 4 ... -m collect sweep SWEEP.yaml

``python -m collect sweep`` lands here when torchrun's environment is set. Every
rank walks the same schedule (plans of this job's world size and ranks per node only), measures
with the same ``measure_on_rank`` as the local pool, and rank 0 gathers the
per-rank outcomes and appends rows. On GPUs the job first takes its fingerprint
on its own devices (``fingerprint_on_ranks``: on one GPU, matmuls, a copy and the
block profile in the sweep's dtype; on more, the collectives over all of them),
saved to data/hardware, whose id every row carries. A plan that kills the job (a device
OOM on some ranks, a hang until the NCCL timeout) cannot be recorded by the job
itself: rank 0 keeps the plan in flight in ``<sweep>.inflight``, and the next
run records it as an error and moves on. Restart the job (``srun`` again, or
``--requeue``) to resume. An active sweep runs the same way through
``python -m gnn.acquire``: rank 0 chooses each batch and every rank measures it.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from collect.active import ActiveLoop, TimeModel
from collect.hardware.fingerprint import measure_fingerprint_on_rank
from collect.launch.fingerprint import MAX_MESSAGE_BYTES, largest_message, save_fingerprint
from collect.launch.result import RankOutcome, build_row, combine_ranks
from collect.measure.plan import measure_on_rank
from collect.measure.trainer import TORCH_DTYPES
from collect.schema import RunSpec
from collect.store import ResultStore, StoreBusyError
from collect.sweep import SweepSpec, all_points, measurement_id, schedule_measurements


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "LOCAL_RANK" in os.environ)


def _device() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def init_torchrun(timeout_s: float) -> torch.device:
    """This rank's device, with the job's process group: NCCL on GPUs, gloo on CPUs."""
    device = _device()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return device


def fingerprint_on_ranks(
    device: torch.device, max_bytes: int, hardware_dir: str | Path, blocks: bool = True,
    dtype: torch.dtype = torch.float32, device_kind: str | None = None,
) -> str | None:  # fmt: skip
    """The job's fingerprint, every rank measuring on its own device: one rank, compute and (``blocks``) the block
    profile in ``dtype``; more, the collectives over all of them. Rank 0 saves it and returns its id; others None."""
    points = measure_fingerprint_on_rank(max_bytes, blocks=blocks, device=device, dtype=dtype)
    if dist.get_rank() != 0:
        return None
    machine = {"device": device.type, "world_size": dist.get_world_size()}
    if device.type == "cuda":
        machine |= {
            "device_kind": device_kind,
            "device_name": torch.cuda.get_device_name(device),
            "cuda": torch.version.cuda,
            "memory_bytes": torch.cuda.get_device_properties(device).total_memory,
        }
    return save_fingerprint(points, Path(hardware_dir), socket.gethostname(), machine)


def run_under_torchrun(
    spec: SweepSpec,
    out_dir: str | Path,
    limit: int | None = None,
    surrogate: Callable[[str], TimeModel] | None = None,
    hardware_dir: str | Path = "data/hardware",
) -> dict | None:
    """Returns the status counts on rank 0, None on the other ranks. ``surrogate``: for active sweeps, makes the
    model that chooses plans, given the hardware's name (the sweep's device_kind: a preset such as h100-80gb)."""
    if spec.sampler == "active" and surrogate is None:  # on every rank, before any waits for another
        raise ValueError("sampler: active needs a surrogate: run it with `python -m gnn.acquire SWEEP.yaml`")
    device = init_torchrun(spec.deadline_s)
    job = _Job(
        spec, ResultStore(Path(out_dir) / f"{spec.name}.parquet"), device, dist.get_rank(), dist.get_world_size()
    )
    with contextlib.ExitStack() as lock:
        refusal = None
        if job.rank == 0:  # one job per output, as the local pool: a second would measure the same plans again
            try:
                lock.enter_context(job.store.writing())
            except StoreBusyError as exc:
                refusal = str(exc)
        refusal = job._from_rank0(refusal)
        if refusal:
            dist.destroy_process_group()
            raise StoreBusyError(refusal)
        _run_job(job, spec, limit, surrogate, hardware_dir)
    dist.destroy_process_group()
    return job.counts if job.rank == 0 else None


def _run_job(job: _Job, spec: SweepSpec, limit: int | None, surrogate, hardware_dir: str | Path) -> None:
    if job.device.type == "cuda":  # a GPU job fingerprints its machine; CPU jobs (the tests) leave data/hardware alone
        mine = [p for p in (spec.points or all_points(spec)) if job.runs(p)]
        job.fingerprint_id = fingerprint_on_ranks(
            job.device, largest_message([(p,) for p in mine]) if mine else MAX_MESSAGE_BYTES, hardware_dir,
            blocks=spec.profile_blocks, dtype=TORCH_DTYPES[mine[0].workload.dtype] if mine else torch.float32,
            device_kind=spec.device_kind,
        )  # fmt: skip
    if job.rank == 0:
        print(f"{spec.name}: fingerprint {job.fingerprint_id}", flush=True)
        _record_crashed_plan(job.store, job.inflight, spec)
        # the sweep's own spec beside its results, as run (as collect.launch.run writes it)
        job.store.parquet_path.with_suffix(".sweep.json").write_text(spec.model_dump_json(indent=2))
    if spec.sampler == "active":
        job.run_active(surrogate, limit)
    else:
        job.run_scheduled(limit)
    if job.rank == 0:
        job.store.compact()


@dataclass
class _Job:
    """One rank's part of a sweep under torchrun: every rank measures each plan, rank 0 stores its row."""

    spec: SweepSpec
    store: ResultStore
    device: torch.device
    rank: int
    world: int
    counts: dict = field(default_factory=lambda: {"ok": 0, "oom": 0, "error": 0, "timeout": 0})
    fingerprint_id: str | None = None

    @property
    def per_node(self) -> int:
        """Ranks on each node of this launch (torchrun's --nproc_per_node)."""
        return int(os.environ.get("LOCAL_WORLD_SIZE", self.world))

    def runs(self, point: RunSpec) -> bool:
        """Whether this job measures the plan: its world size and its devices per node are the launch's, so that
        a row's nodes and devices_per_node say how it ran (2 nodes x 1 rank is not 1 node x 2 ranks)."""
        return point.cluster.world_size == self.world and point.cluster.devices_per_node == self.per_node

    @property
    def inflight(self) -> Path:
        return self.store.parquet_path.with_suffix(".inflight")

    def run_scheduled(self, limit: int | None) -> None:
        todo = None
        if self.rank == 0:
            df = self.store.load()
            # Errors count as done here: a plan that killed the job would kill it again.
            done = set(df["measurement_id"]) if len(df) else set()
            schedule = schedule_measurements(self.spec)
            todo = [m for m in schedule if self.runs(m[0]) and measurement_id(m[0], m[1]) not in done][:limit]
            elsewhere = sum(m[0].cluster.world_size == self.world and not self.runs(m[0]) for m in schedule)
            if elsewhere:
                print(f"{self.spec.name}: {elsewhere} plans of world size {self.world} lay out their ranks over other "
                      f"nodes than this launch's {self.per_node} per node: set devices_per_node in the sweep to match "
                      "--nproc_per_node", flush=True)  # fmt: skip
        todo = self._from_rank0(todo)
        for point, repeat_index, group in todo:
            self.measure(point, f"[{len(todo)}]", repeat_index, repeat_group=group)

    def run_active(self, surrogate: Callable[[str], TimeModel], limit: int | None) -> None:
        loop = None
        if self.rank == 0:
            mine = [p for p in all_points(self.spec) if self.runs(p)]
            loop = ActiveLoop(self.spec, mine, surrogate(self.spec.device_kind), self.store.load().to_dict("records"))
        measured = 0
        while limit is None or measured < limit:
            batch = self._from_rank0(loop.next_batch() if loop else None)
            if not batch:
                break
            for point, role in batch[: None if limit is None else limit - measured]:
                row = self.measure(point, f"[{loop.spent_hours:.3f} h]" if loop else "", active_role=role)
                if loop:
                    loop.add(row)
                measured += 1
        if loop:
            print(f"{self.spec.name}: stopped, {loop.stopped_by or 'at the limit'}", flush=True)

    def _from_rank0(self, value):
        shared = [value]
        dist.broadcast_object_list(shared, src=0)
        return shared[0]

    def measure(self, point: RunSpec, progress: str, repeat_index: int = 0, **extra) -> dict | None:
        """Measure one plan on every rank; rank 0 stores and returns its row."""
        mid = measurement_id(point, repeat_index)
        if self.rank == 0:  # whole or absent: a kill mid-write must not leave an empty marker
            partial = self.inflight.with_suffix(".inflight.tmp")
            partial.write_text(mid)
            os.replace(partial, self.inflight)
        start = time.perf_counter()
        outcome = _measure(point, self.device, self.spec)
        gathered = [None] * self.world if self.rank == 0 else None
        dist.gather_object(outcome, gathered, dst=0)
        if self.rank != 0:
            return None
        wall_s = time.perf_counter() - start
        result = combine_ranks(point, dict(enumerate(gathered)), self.world, self.spec.deadline_s, wall_s)
        self.counts[result.status] += 1
        row = build_row(
            point, result, measurement_id=mid, sweep_id=self.spec.name, fingerprint_id=self.fingerprint_id,
            host=socket.gethostname(), ref_time_s=None, is_reference=False, repeat_index=repeat_index,
            **{"repeat_group": None, **extra},
        )  # fmt: skip
        self.store.append(row)
        self.inflight.unlink()
        print(f"{progress} {mid}: {result.status} {result.iter_time_s}", flush=True)
        return row


def _measure(point, device: torch.device, spec: SweepSpec) -> RankOutcome:
    # NOTE: after an OOM or an error peers may be inside a collective this rank left; if they hang, the
    # process-group timeout ends the job and the in-flight marker records it.
    try:
        outcome = RankOutcome(ok=True, **measure_on_rank(point, device, spec.measure))
    except torch.OutOfMemoryError as exc:
        outcome = RankOutcome(ok=False, oom=True, error=str(exc)[:500])
    except Exception as exc:  # the plan's error, as the local pool records it: the next plan still runs
        outcome = RankOutcome(ok=False, error=f"{type(exc).__name__}: {exc}"[:500])
        traceback.print_exc()
    if not outcome.ok:  # the failed plan's tensors, held by the exception's frames until now
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return outcome


def _record_crashed_plan(store: ResultStore, inflight: Path, spec: SweepSpec) -> None:
    if not inflight.exists():
        return
    mid = inflight.read_text().strip()
    if not mid or mid in store.done_ids():  # stored before the job died (between the append and the unlink)
        inflight.unlink()
        return
    store.append(
        {
            "measurement_id": mid,
            "run_id": mid.rsplit("-r", 1)[0],  # so that an active sweep does not choose it again
            "sweep_id": spec.name,
            "status": "error",
            "is_reference": False,
            "error": "the job died while measuring this plan (under torchrun an OOM on some ranks "
            "or a hung collective ends the job)",
        }
    )
    inflight.unlink()
