"""Run a sweep with the local pool: resumable, loss-free, with a noise floor.

    python -m collect sweep collect/sweeps/default.yaml [--out data/runs] [--limit N]

One LocalPool per world size stays alive for the whole sweep (idle ranks block
on their queue and cost no CPU), so world sizes interleave freely. Before
anything is measured the hardware fingerprint is taken and saved to
data/hardware/<id>.json. Every ``reference_every`` plans of a world size its
reference plan is re-measured; each row carries the latest reference time.
An active sweep (``sampler: active``) measures the batches collect.active.ActiveLoop
chooses, with a surrogate the caller gives (gnn.acquire).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from collect.active import ActiveLoop, TimeModel
from collect.launch.fingerprint import largest_message, take_fingerprint
from collect.launch.pool import LocalPool
from collect.launch.result import build_row
from collect.measure.fits import refuse_unfit
from collect.measure.memory import CPU_FALLBACK_METHOD, PEAK_MEM_METHODS, affected_by_unreported_frees
from collect.schema import Cluster, Plan, RunSpec, Workload
from collect.store import ResultStore, StoreWriteError
from collect.sweep import SweepSpec, all_points, measurement_id, schedule_measurements

COMPACT_EVERY = 50  # rows between journal -> Parquet compactions
_ACTIVE_BAR = "{desc}: {n:.3f}/{total:.3f} {unit} spent |{bar}| {elapsed}{postfix}"


def reference_spec(world_size: int) -> RunSpec:
    """A fixed small data-parallel plan, the drift probe for one world size."""
    workload = Workload(
        layers=2, hidden=128, heads=4, seq_len=64, vocab=512, micro_batch_size=2, global_batch_size=2 * world_size
    )
    return RunSpec(
        workload=workload, plan=Plan(dp=world_size), cluster=Cluster(devices_per_node=world_size, memory_bytes=2**34)
    )


class SweepRunner:
    def __init__(
        self,
        spec: SweepSpec,
        out_dir: str | Path = "data/runs",
        hardware_dir: str | Path = "data/hardware",
        surrogate: Callable[[str], TimeModel] | None = None,
    ):
        """``surrogate``: for active sweeps, makes the model that chooses plans, given the hardware's name."""
        if spec.sampler == "active" and surrogate is None:
            raise ValueError(
                f"{spec.name}: sampler: active chooses plans with a surrogate model, which collect does not import: "
                "run it with `python -m gnn.acquire SWEEP.yaml` (`make collect` does)"
            )
        self.spec = spec
        self.surrogate = surrogate
        self.store = ResultStore(Path(out_dir) / f"{spec.name}.parquet")
        self.hardware_dir = Path(hardware_dir)
        self.host = socket.gethostname()
        self.counts = {"ok": 0, "oom": 0, "error": 0, "timeout": 0}
        self.ref_time: dict[int, float] = {}
        self.since_ref: dict[int, int] = {}

    def run(self, limit: int | None = None, remeasure_memory: bool = False, allow_oom: bool = False) -> dict:
        """``allow_oom``: run plans whose peak-memory lower bound is over this machine's share (else WontFit)."""
        with self.store.writing():  # one sweep per output: a second is refused, not run beside this one
            return self._run(limit, remeasure_memory, allow_oom)

    def _run(self, limit: int | None, remeasure_memory: bool, allow_oom: bool = False) -> dict:
        if self.spec.sampler == "active":
            return self._run_active(limit)
        order = schedule_measurements(self.spec)
        done = self.store.done_ids() - (self._stale_memory_ids() if remeasure_memory else set())
        todo = [item for item in order if measurement_id(item[0], item[1]) not in done]
        if remeasure_memory:  # FSDP's peaks were the furthest off: measure them again first
            todo.sort(key=lambda item: not (item[0].plan.fsdp_enabled and item[0].plan.dp > 1))
        skipped = len(order) - len(todo)
        if limit is not None:
            todo = todo[:limit]
        if not allow_oom:  # the machine only: the sweep's cluster.memory_bytes are the oom labels it measures
            refuse_unfit([p for p, _, _ in todo], self.spec.name, cluster=False)
        _save_spec(self.spec, self.store.parquet_path)
        if not todo:
            print(f"{self.spec.name}: all {len(order)} measurements already in {self.store.parquet_path}")
            return self.counts
        with ExitStack() as stack:
            self._start(stack, [p for p, _, _ in todo])
            self._compacting(lambda: self._measure_all(todo, skipped=skipped))
        return self.counts

    def _run_active(self, limit: int | None) -> dict:
        candidates = all_points(self.spec)
        _save_spec(self.spec, self.store.parquet_path)
        loop = ActiveLoop(self.spec, candidates, None, self.store.load().to_dict("records"))
        if loop.finished:
            print(f"{self.spec.name}: {loop.stopped_by}; {len(loop.rows)} plans in {self.store.parquet_path}")
            return self.counts
        with ExitStack() as stack:
            self._start(stack, candidates)
            loop.surrogate = self.surrogate(self.fingerprint_id)
            self._compacting(lambda: self._measure_active(loop, limit))
        return self.counts

    def _start(self, stack: ExitStack, points: list[RunSpec]) -> None:
        """A pool per world size, then the fingerprint (which needs them)."""
        world_sizes = sorted({p.cluster.world_size for p in points})
        self.pools = {
            ws: stack.enter_context(LocalPool(ws, self.spec.measure, self.spec.deadline_s)) for ws in world_sizes
        }
        self.fingerprint_id = take_fingerprint(
            self.pools, largest_message([(p,) for p in points]), self.hardware_dir, self.host,
            blocks=self.spec.profile_blocks,
        )  # fmt: skip

    def _compacting(self, measure: Callable[[], None]) -> None:
        try:
            measure()
        except StoreWriteError:
            raise  # the disk refuses writes: compacting would too, and the journal holds every stored row
        except BaseException:
            self.store.compact()
            raise
        self.store.compact()

    def _stale_memory_ids(self) -> set[str]:
        """Stored CPU measurements whose peak an older accounting overstated (collect.measure.memory): measuring them
        again replaces their rows; the previous values stay in the repository's history."""
        rows = self.store.load()
        if not len(rows):
            return set()
        method = rows.get("peak_mem_method", pd.Series(index=rows.index, dtype=object))
        stale = (rows["device"] == "cpu") & (method != PEAK_MEM_METHODS["cpu"])
        affected = rows.apply(
            lambda r: affected_by_unreported_frees(
                Plan.model_validate({k: r[k] for k in Plan.model_fields if k in r and pd.notna(r[k])})
            ),
            axis=1,
        )
        # peaks read without the counting allocator (no compiler then) are worth reading again on every plan
        return set(rows.loc[stale & (affected | (method == CPU_FALLBACK_METHOD)), "measurement_id"])

    def _measure_all(self, todo, skipped: int) -> None:
        bar = tqdm(todo, desc=self.spec.name, unit="plan", dynamic_ncols=True)
        if skipped:
            bar.write(f"resuming: {skipped} measurements already stored, {len(todo)} to go")
        for n, (point, repeat_index, repeat_group) in enumerate(bar, start=1):
            self._measure(point, repeat_index, repeat_group)
            bar.set_postfix(self.counts, refresh=False)
            if n % COMPACT_EVERY == 0:
                self.store.compact()

    def _measure_active(self, loop: ActiveLoop, limit: int | None) -> None:
        budget_h = self.spec.budget_device_hours
        bar = tqdm(total=budget_h or self.spec.budget_runs, desc=self.spec.name, dynamic_ncols=True,
                   unit="device-h" if budget_h else "plan", bar_format=_ACTIVE_BAR)  # fmt: skip
        if loop.rows:
            bar.n = round(loop.spent_hours if budget_h else loop.runs, 4)
            bar.write(f"resuming: {len(loop.rows)} plans already measured")
        measured = 0
        while limit is None or measured < limit:
            batch = loop.next_batch()
            if not batch:
                bar.write(f"{self.spec.name}: stopped, {loop.stopped_by}")
                break
            for point, role in batch[: None if limit is None else limit - measured]:
                loop.add(self._measure(point, active_role=role, active_runs_before=loop.runs))
                measured += 1
                bar.n = round(loop.spent_hours if budget_h else loop.runs, 4)
                mape = "-" if loop.check_mape is None else f"{100 * loop.check_mape:.1f}%"
                bar.set_postfix({"role": role, "check MAPE": mape, **self.counts}, refresh=True)
            self.store.compact()
        bar.close()

    def _measure(self, point: RunSpec, repeat_index: int = 0, repeat_group: str | None = None, **extra) -> dict:
        """Measure one plan (and first the reference, when it is due) and store its row."""
        ws = point.cluster.world_size
        if ws not in self.ref_time or self.since_ref[ws] >= self.spec.reference_every:
            self._measure_reference(ws)
        result = self.pools[ws].run(point)
        self.since_ref[ws] += 1
        self.counts[result.status] += 1
        mid = measurement_id(point, repeat_index)
        row = self._row(point, result, mid, repeat_group=repeat_group, repeat_index=repeat_index, **extra)
        self.store.append(row)
        return row

    def _measure_reference(self, ws: int) -> None:
        spec = reference_spec(ws)
        result = self.pools[ws].run(spec)
        if result.status == "ok":
            self.ref_time[ws] = result.iter_time_s
        self.since_ref[ws] = 0
        self.store.append(self._row(spec, result, f"ref-{ws}-{int(time.time() * 1000)}", is_reference=True))

    def _row(self, point: RunSpec, result, mid: str, **extra) -> dict:
        return build_row(
            point,
            result,
            measurement_id=mid,
            sweep_id=self.spec.name,
            fingerprint_id=self.fingerprint_id,
            host=self.host,
            ref_time_s=self.ref_time.get(point.cluster.world_size),
            **{"repeat_group": None, "repeat_index": 0, "is_reference": False, **extra},
        )


def _save_spec(spec: SweepSpec, parquet_path: Path) -> None:
    """The sweep's own spec beside its results, as run (vidur-style)."""
    path = parquet_path.with_suffix(".sweep.json")
    path.write_text(spec.model_dump_json(indent=2))
