"""From per-rank outcomes to one measured result, and from a result to a dataset row."""

from __future__ import annotations

import datetime
import statistics
from dataclasses import dataclass, field

import numpy as np

from collect.measure.memory import PEAK_MEM_METHODS
from collect.schema import RunSpec


@dataclass
class RankOutcome:
    """What one rank reports for one plan."""

    ok: bool
    times: list[float] = field(default_factory=list)
    peak_mem_bytes: int = 0
    rss_hwm_bytes: int | None = None
    peak_mem_method: str = ""  # how this rank read its peak (collect.measure.memory)
    error: str = ""
    oom: bool = False  # a real device OOM (CUDA)
    extra: list = field(default_factory=list)  # non-plan tasks (fingerprint timings)


@dataclass
class RunResult:
    """One measured plan: status ok | oom | error | timeout."""

    status: str
    error: str = ""
    iter_times_s: list[float] = field(default_factory=list)
    peak_mem_bytes_per_rank: list[int] = field(default_factory=list)
    rss_hwm_bytes_per_rank: list[int | None] = field(default_factory=list)
    wall_s: float = 0.0
    peak_mem_method: str = ""  # every rank's, the same; empty where no rank measured

    @property
    def iter_time_s(self) -> float | None:
        return statistics.median(self.iter_times_s) if self.iter_times_s else None

    @property
    def peak_mem_bytes(self) -> int | None:
        return max(self.peak_mem_bytes_per_rank) if self.peak_mem_bytes_per_rank else None


def combine_ranks(
    spec: RunSpec, outcomes: dict[int, RankOutcome], world_size: int, deadline_s: float, wall_s: float
) -> RunResult:
    failed = [(r, o) for r, o in sorted(outcomes.items()) if not o.ok]
    if any(o.oom for _, o in failed):
        rank, o = next((r, o) for r, o in failed if o.oom)
        return RunResult("oom", error=f"rank {rank}: {o.error}", wall_s=wall_s)
    if failed:
        rank, o = failed[0]
        return RunResult("error", error=f"rank {rank}: {o.error}", wall_s=wall_s)
    if len(outcomes) < world_size:
        missing = sorted(set(range(world_size)) - set(outcomes))
        return RunResult(
            "timeout", error=f"ranks {missing} gave no result within {deadline_s:.0f} s (or died)", wall_s=wall_s
        )
    ranks = [outcomes[r] for r in range(world_size)]
    methods = sorted({o.peak_mem_method for o in ranks})
    if len(methods) > 1:  # e.g. one rank without the counting allocator: peaks read two ways are not one peak
        return RunResult("error", error=f"ranks read their peaks by different methods: {methods}", wall_s=wall_s)
    # An iteration lasts until its slowest rank finishes.
    iter_times = [max(ts) for ts in zip(*(o.times for o in ranks))]
    peaks = [o.peak_mem_bytes for o in ranks]
    status = "oom" if max(peaks) > spec.cluster.memory_bytes else "ok"
    error = (
        f"measured peak {max(peaks)} B > cluster.memory_bytes {spec.cluster.memory_bytes} B" if status == "oom" else ""
    )
    return RunResult(
        status,
        error=error,
        iter_times_s=iter_times,
        peak_mem_bytes_per_rank=peaks,
        rss_hwm_bytes_per_rank=[o.rss_hwm_bytes for o in ranks],
        wall_s=wall_s,
        peak_mem_method=methods[0],
    )


def build_row(spec: RunSpec, result: RunResult, **extra) -> dict:
    """One dataset row: the spec flattened, the measurement, and sweep bookkeeping in ``extra``."""
    w, p, c = spec.workload, spec.plan, spec.cluster
    times = np.asarray(result.iter_times_s, dtype=float)
    row = {
        "run_id": spec.run_id,
        "collected_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "status": result.status,
        "error": result.error,
        "world_size": c.world_size,
        **p.model_dump(),
        **w.model_dump(),
        "nodes": c.nodes,
        "devices_per_node": c.devices_per_node,
        "device": c.device,
        "device_kind": c.device_kind,
        "memory_bytes": c.memory_bytes,
        "backend": c.backend,
        "num_params": w.num_params,
        "iter_time_s": result.iter_time_s,
        "iter_time_p10_s": float(np.percentile(times, 10)) if times.size else None,
        "iter_time_p90_s": float(np.percentile(times, 90)) if times.size else None,
        "iter_times_s": list(result.iter_times_s),
        "peak_mem_bytes": result.peak_mem_bytes,
        "peak_mem_bytes_per_rank": list(result.peak_mem_bytes_per_rank),
        "peak_mem_method": result.peak_mem_method or PEAK_MEM_METHODS[c.device],
        "rss_hwm_bytes": max((b for b in result.rss_hwm_bytes_per_rank if b is not None), default=None),
        "wall_s": round(result.wall_s, 3),
    }
    row.update(extra)
    return row
