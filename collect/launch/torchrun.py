"""Run a sweep under torchrun: GPU clusters (NCCL, one process per GPU, multi-node).

    torchrun --nproc_per_node 8 --nnodes 4 ... -m collect sweep SWEEP.yaml

``python -m collect sweep`` lands here when torchrun's environment is set. Every
rank walks the same schedule (plans of this job's world size only), measures
with the same ``measure_on_rank`` as the local pool, and rank 0 gathers the
per-rank outcomes and appends rows. A plan that kills the job (a device OOM
on some ranks, a hang until the NCCL timeout) cannot be recorded by the job
itself: rank 0 keeps the plan in flight in ``<sweep>.inflight``, and the next
run records it as an error and moves on. Restart the job (``srun`` again, or
``--requeue``) to resume.
"""

from __future__ import annotations

import datetime
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from collect.launch.result import RankOutcome, build_row, combine_ranks
from collect.measure.plan import measure_on_rank
from collect.store import ResultStore
from collect.sweep import SweepSpec, measurement_id, schedule_measurements


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "LOCAL_RANK" in os.environ)


def _device() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def run_under_torchrun(spec: SweepSpec, out_dir: str | Path, limit: int | None = None) -> dict | None:
    """Returns the status counts on rank 0, None on the other ranks."""
    device = _device()
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(seconds=spec.deadline_s)
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    store = ResultStore(Path(out_dir) / f"{spec.name}.parquet")
    inflight = store.parquet_path.with_suffix(".inflight")
    todo = None
    if rank == 0:
        _record_crashed_plan(store, inflight, spec)
        df = store.load()
        # Errors count as done here: a plan that killed the job would kill it again.
        done = set(df["measurement_id"]) if len(df) else set()
        todo = [
            m
            for m in schedule_measurements(spec)
            if m[0].cluster.world_size == world and measurement_id(m[0], m[1]) not in done
        ][:limit]
    shared = [todo]
    dist.broadcast_object_list(shared, src=0)
    counts = {"ok": 0, "oom": 0, "error": 0, "timeout": 0}
    for point, repeat_index, group in shared[0]:
        mid = measurement_id(point, repeat_index)
        if rank == 0:
            inflight.write_text(mid)
        outcome = _measure(point, device, spec)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(outcome, gathered, dst=0)
        if rank == 0:
            result = combine_ranks(point, dict(enumerate(gathered)), world, spec.deadline_s, 0.0)
            counts[result.status] += 1
            store.append(
                build_row(
                    point,
                    result,
                    measurement_id=mid,
                    sweep_id=spec.name,
                    fingerprint_id=None,
                    host=socket.gethostname(),
                    ref_time_s=None,
                    repeat_group=group,
                    repeat_index=repeat_index,
                    is_reference=False,
                )
            )
            inflight.unlink()
            print(f"[{len(shared[0])}] {mid}: {result.status} {result.iter_time_s}", flush=True)
    if rank == 0:
        store.compact()
    dist.destroy_process_group()
    return counts if rank == 0 else None


def _measure(point, device: torch.device, spec: SweepSpec) -> RankOutcome:
    try:
        return RankOutcome(ok=True, **measure_on_rank(point, device, spec.measure))
    except torch.OutOfMemoryError as exc:
        # NOTE: peers may be inside a collective this rank left; if they hang, the
        # process-group timeout ends the job and the in-flight marker records it.
        return RankOutcome(ok=False, oom=True, error=str(exc)[:500])


def _record_crashed_plan(store: ResultStore, inflight: Path, spec: SweepSpec) -> None:
    if not inflight.exists():
        return
    mid = inflight.read_text().strip()
    store.append(
        {
            "measurement_id": mid,
            "sweep_id": spec.name,
            "status": "error",
            "is_reference": False,
            "error": "the job died while measuring this plan (under torchrun an OOM on some ranks "
            "or a hung collective ends the job)",
        }
    )
    inflight.unlink()
