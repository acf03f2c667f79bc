"""A sweep traced under fake tensors: each plan's peak memory per pipeline stage at full size, and no time.

    python -m collect.fake.sweep SWEEP.yaml [--out data/fake] [--limit N] [--workers 1] [--timeout-s 1800]

The sweep's points (collect.sweep: its explicit points, or those its sampler draws; no repeats, a trace is
deterministic; none that the sweeps its skip_traced_by names traced into <out>) are traced one pipeline stage at a
time, the stage's first rank in a process of its own (collect.fake.trace): with tensor, data and expert parallelism
balanced, every rank of a stage holds what its first does. Each plan is a row of <out>/<name>.parquet through the
ResultStore (journalled as it ends: resumable, and nothing is lost to a crash, Ctrl-C or `kill`, each of which kills
the traces it stops), with
- ``peak_mem_method`` "fake", never a measured method; ``peak_mem_bytes_per_rank`` the traced stages' peaks,
  ``traced_ranks`` their ranks; ``peak_mem_bytes`` their maximum;
- no time: ``iter_time_s`` is empty; ``trace_cpu_s`` the CPU seconds the traces took, ``wall_s`` their wall time;
- ``traced_depths``: a deep stack is traced at three depths and its peaks extrapolated (collect.fake.depth), the
  depths (blocks per pipeline chunk) given here, empty where every stage was traced whole; ``depth_miss`` the most a
  segment's line missed its third depth by (a fraction), ``depth_fallbacks`` the stages traced whole because one
  missed by more;
- ``traced_microbatches``: a plan of many micro-batches is traced at two counts and its peaks extrapolated along
  the line through them (``sampled_counts``), the counts given here; empty where it was traced whole;
  ``microbatch_line_ranks`` the traced ranks so extrapolated (a last stage that merges its kept outputs is traced
  whole: ``merges_outputs``);
- ``status`` "ok", or "error" saying which rank failed and how (what torch could not trace), or "timeout"; a plan
  the collector does not run as it is written (collect.schema's collect_problems: a convention it does not
  implement, such as fp32 master weights) is an "error" row saying so, not traced as something else.
What the hardware adds on top (CUDA's context, NCCL's buffers, the caching allocator's gaps) is not in a fake peak.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from collect import REPO
from collect.fake.depth import DepthMismatch, extrapolate, sampled_depths, target_depth
from collect.inputs import run_reporting_errors
from collect.launch.result import RunResult, build_row
from collect.schema import RunSpec, collect_problems
from collect.store import ResultStore
from collect.sweep import SweepSpec, sample_points

FAKE_METHOD = "fake"
POLL_S = 0.5  # a running trace is checked for its deadline and a stop this often
STOPPED = "stopped before it was traced"


def stage_ranks(spec: RunSpec) -> list[int]:
    """The first rank of each pipeline stage (the mesh is pp-major: collect.parallel.mesh)."""
    stride = spec.cluster.world_size // spec.plan.pp
    return [stage * stride for stage in range(spec.plan.pp)]


def sampled_counts(spec: RunSpec) -> tuple[int, int] | None:
    """Two micro-batch counts whose traces give the plan's peaks on a line, or None to trace it whole.

    Past the schedule's warm-up every micro-batch is alike: each more one adds the same bytes (a pipeline's
    receive buffers and kept outputs) or none (accumulation), so a peak is affine in the count from there on. Both
    counts take every rank past its warm-up and one micro-batch more (the first backward allocates the gradients);
    an interleaved schedule needs multiples of pp. tests/collect/fake/test_sweep.py checks the line against whole
    traces."""
    plan = spec.plan
    first = 3 * plan.pp if plan.interleaved else plan.pp + 1
    return (first, first + plan.pp) if plan.num_microbatches > first + plan.pp else None


def trace_point(spec: RunSpec, timeout_s: float, should_stop=None) -> tuple[RunResult, dict]:
    """Every stage's first rank traced, in a process each (at two micro-batch counts and extrapolated, for many; at
    three depths and extrapolated, for a deep stack); the result and the row's extra fields. ``should_stop``: asked
    every POLL_S while a trace runs; once it answers True the trace is killed and the result is a "stopped" error."""
    start, cpu_s = time.monotonic(), 0.0
    problems = collect_problems(spec.workload, spec.plan, spec.cluster)
    if problems:
        return RunResult("error", error="; ".join(problems)), {}
    ranks, counts = stage_ranks(spec), sampled_counts(spec)
    lines, depths = [], {"traced_depths": [], "depth_miss": 0.0, "depth_fallbacks": 0}
    on_line = [rank for stage, rank in enumerate(ranks) if counts and not merges_outputs(spec, stage)]
    for stage, rank in enumerate(ranks):
        left = timeout_s - (time.monotonic() - start)
        outcome = _trace_stage(spec, stage, rank, left, counts if rank in on_line else None, depths, should_stop)
        if isinstance(outcome, RunResult):
            outcome.wall_s = time.monotonic() - start
            return outcome, {}
        peaks, stage_cpu_s = outcome
        lines.append(peaks)
        cpu_s += stage_cpu_s
    peaks = [_at(line, counts, spec.plan.num_microbatches) for line in lines]
    result = RunResult(
        "ok", peak_mem_bytes_per_rank=peaks, wall_s=time.monotonic() - start, peak_mem_method=FAKE_METHOD
    )
    counted = {"traced_ranks": ranks, "trace_cpu_s": round(cpu_s, 2), "traced_microbatches": list(counts or [])}
    return result, {**counted, "microbatch_line_ranks": on_line, **depths}


def merges_outputs(spec: RunSpec, pp_rank: int) -> bool:
    """Whether this pipeline rank ends its step merging every micro-batch's kept output (torch.cat, beside them): the
    last stage's, unless told not to keep them. Its peak is then the larger of two lines of different slopes (the
    merge's, and the schedule's or the optimizer's), which cross at a count of their own: traced whole, not sampled."""
    plan = spec.plan
    return plan.pp_enabled and plan.pipeline_keeps_outputs and pp_rank == plan.pp - 1


def merged_on_a_line(rows: pd.DataFrame) -> pd.Series:
    """The rows whose last stage merges its kept outputs but was read off a micro-batch line all the same: traced
    before such a stage was traced whole, they miss the merge (by 23% and 30% on two plans traced again whole). A
    resumed sweep traces them again; the dataset leaves them out until then (gnn.dataset.rows.load_fake)."""
    if rows.empty:
        return pd.Series(False, index=rows.index)
    sampled = rows["traced_microbatches"].map(lambda counts: counts is not None and len(counts) > 0)
    unrecorded = rows.get("microbatch_line_ranks", pd.Series(None, index=rows.index)).map(_missing)
    return (rows["pp"] > 1) & rows["pipeline_keeps_outputs"].fillna(False).astype(bool) & sampled & unrecorded


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)  # a column older rows lack reads NaN


def _at(peaks: list[int], counts: tuple[int, int] | None, n: int) -> int:
    """A rank's peak at ``n`` micro-batches: traced whole (one peak), or on the line through its two sampled counts."""
    if len(peaks) == 1:
        return peaks[0]
    (a, b), (k1, k2) = peaks, counts
    return round(a + (b - a) * (n - k1) / (k2 - k1))


def _trace_stage(spec: RunSpec, stage: int, rank: int, timeout_s: float, counts, depths: dict, should_stop=None):
    """A stage's rank traced at each micro-batch count (or as written): its peaks and CPU seconds, or the failed
    result. A deep stack is traced at three shallow depths and extrapolated (collect.fake.depth), or whole where a
    segment is off its line (``depths`` gathers what was done)."""
    sampled, start = sampled_depths(spec, stage), time.monotonic()
    outcome = _trace_rank(spec, rank, timeout_s, counts, sampled, should_stop)
    if isinstance(outcome, RunResult) or sampled is None:
        return outcome if isinstance(outcome, RunResult) else ([t["peak_mem_bytes"] for t in outcome], _cpu_s(outcome))
    peaks = []
    try:
        for k in counts or [None]:
            traced = {t["depth"]: t["segments"] for t in outcome if t["microbatches"] == k}
            peak, miss = extrapolate(spec, traced, target_depth(spec, stage))
            peaks.append(peak)
            depths["depth_miss"] = max(depths["depth_miss"], miss)
    except DepthMismatch:
        depths["depth_fallbacks"] += 1
        whole = _trace_rank(spec, rank, timeout_s - (time.monotonic() - start), counts, None, should_stop)
        if isinstance(whole, RunResult):
            return whole
        return [t["peak_mem_bytes"] for t in whole], _cpu_s(whole) + _cpu_s(outcome)
    depths["traced_depths"] = sorted({*depths["traced_depths"], *sampled})
    return peaks, _cpu_s(outcome)


def _cpu_s(traces: list[dict]) -> float:
    return sum(t["cpu_s"] for t in traces)


def _trace_rank(spec: RunSpec, rank: int, timeout_s: float, counts=None, depths=None, should_stop=None):
    """One rank traced in a process of its own at each micro-batch count and depth given (or as written): the
    traces (a list of dicts), or the failed RunResult."""
    command = [sys.executable, "-m", "collect.fake.trace", spec.model_dump_json(), "--rank", str(rank)]
    for option, values in (("--microbatches", counts), ("--depths", depths)):
        command += [option, ",".join(map(str, values))] if values else []
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + max(timeout_s, 1)
    while True:
        try:
            stdout, stderr = process.communicate(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            why = "stopped" if should_stop is not None and should_stop() else None
            if why is None and time.monotonic() < deadline:
                continue
            process.kill()
            process.communicate()
            if why:
                return RunResult("error", error=f"rank {rank}: {STOPPED}")
            return RunResult("timeout", error=f"rank {rank}: not traced within the plan's time")
    if process.returncode < 0:  # killed from outside (the OOM killer, a stop): say so, not its last line
        return RunResult("error", error=f"rank {rank}: killed by signal {-process.returncode}")
    if process.returncode != 0:
        return RunResult("error", error=f"rank {rank}: {_last_error(stderr)}")
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _last_error(stderr: str) -> str:
    """The exception's own line: the last line naming an error, without torchrun's rank prefix."""
    lines = [line.removeprefix("[rank0]: ").strip() for line in stderr.strip().splitlines()]
    named = [line for line in lines if "Error" in line or "Exception" in line]
    return (named or lines or ["no output"])[-1][:500]


def run_sweep(spec: SweepSpec, out_dir: Path, limit: int | None, workers: int, timeout_s: float) -> dict:
    store = ResultStore(out_dir / f"{spec.name}.parquet")
    counts = {"ok": 0, "error": 0, "timeout": 0}
    with store.writing():
        stored = store.load()
        stale = set(stored.loc[merged_on_a_line(stored), "measurement_id"]) if len(stored) else set()
        done = store.done_ids() - stale
        elsewhere = traced_by(out_dir, spec.skip_traced_by)
        todo = [p for p in dict.fromkeys(sample_points(spec)) if f"{p.run_id}-fake" not in done | elsewhere]
        # a seeded order over every world size: a sweep stopped part way holds a sample of the whole space; the
        # plans to trace again come first
        todo = random.Random(spec.seed).sample(todo, len(todo))
        todo = sorted(todo, key=lambda p: f"{p.run_id}-fake" not in stale)[:limit]
        (out_dir / f"{spec.name}.sweep.json").write_text(spec.model_dump_json(indent=2))
        stop = threading.Event()  # set on Ctrl-C or SIGTERM: every running trace's process is killed, not orphaned
        with ThreadPoolExecutor(workers) as pool, tqdm(total=len(todo), desc=spec.name, unit="plan") as bar:
            futures = {pool.submit(trace_point, point, timeout_s, stop.is_set): point for point in todo}
            try:
                for future in as_completed(futures):
                    point = futures[future]
                    result, extra = future.result()
                    store.append(_row(spec, point, result, extra))
                    counts[result.status] += 1
                    bar.update()
                    bar.set_postfix(counts)
            except BaseException as exc:  # what was stopped is not a row: a resume traces it
                stop.set()
                pool.shutdown(wait=True, cancel_futures=True)
                if isinstance(exc, KeyboardInterrupt):  # what finished reaches the Parquet file (journals: not in git)
                    store.compact()
                raise
        store.compact()
    return {"traced": sum(counts.values()), **counts, "skipped_done": len(done), "traced_elsewhere": len(elsewhere)}


def traced_by(out_dir: Path, sweeps: list[str]) -> set[str]:
    """The plans ``sweeps`` (SweepSpec.skip_traced_by) traced into ``out_dir``."""
    missing = [name for name in sweeps if not (out_dir / f"{name}.parquet").exists()]
    if missing:
        raise SystemExit(f"error: skip_traced_by names {', '.join(missing)}, which {out_dir} does not hold")
    return set().union(*(ResultStore(out_dir / f"{name}.parquet").done_ids() for name in sweeps))


_NOT_TRACED_DEPTHS = {"traced_depths": [], "depth_miss": None, "depth_fallbacks": None}
_NOT_TRACED_LINES = {"traced_microbatches": [], "microbatch_line_ranks": []}


def _row(spec: SweepSpec, point: RunSpec, result: RunResult, extra: dict) -> dict:
    return build_row(
        point, result, measurement_id=f"{point.run_id}-fake", sweep_id=spec.name, fingerprint_id=None, host=None,
        ref_time_s=None, repeat_group=None, repeat_index=0, is_reference=False,
        **{"traced_ranks": [], "trace_cpu_s": None, **_NOT_TRACED_LINES, **_NOT_TRACED_DEPTHS, **extra},
    )  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collect.fake.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", help="a sweep YAML (collect.sweep.SweepSpec)")
    parser.add_argument("--out", type=Path, default=REPO / "data" / "fake")
    limit_help = "trace at most this many plans not yet traced, those to trace again first"
    parser.add_argument("--limit", type=int, default=None, help=limit_help)
    parser.add_argument("--workers", type=int, default=1, help="plans traced at once, one process each")
    parser.add_argument("--timeout-s", type=float, default=1800, help="per plan, all its stages")
    args = parser.parse_args(argv)
    spec = SweepSpec.from_yaml(args.sweep)
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops a sweep as Ctrl-C does
    run_reporting_errors(lambda: print(json.dumps(run_sweep(spec, args.out, args.limit, args.workers, args.timeout_s))))
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
