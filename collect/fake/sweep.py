"""A sweep traced under fake tensors: each plan's peak memory per pipeline stage at full size, and no time.

    python -m collect.fake.sweep SWEEP.yaml [--out data/fake] [--limit N] [--workers 1] [--timeout-s 1800]

The sweep's points (collect.sweep: its explicit points, or those its sampler draws; no repeats, a trace is
deterministic) are traced one pipeline stage at a time, the stage's first rank in a process of its own
(collect.fake.trace): with tensor, data and expert parallelism balanced, every rank of a stage holds what its first
does. Each plan is a row of <out>/<name>.parquet through the ResultStore (journalled as it ends: resumable, and
nothing is lost to a crash or Ctrl-C), with
- ``peak_mem_method`` "fake", never a measured method; ``peak_mem_bytes_per_rank`` the traced stages' peaks,
  ``traced_ranks`` their ranks; ``peak_mem_bytes`` their maximum;
- no time: ``iter_time_s`` is empty; ``trace_cpu_s`` the CPU seconds the traces took, ``wall_s`` their wall time;
- ``status`` "ok", or "error" saying which rank failed and how (what torch could not trace), or "timeout".
What the hardware adds on top (CUDA's context, NCCL's buffers, the caching allocator's gaps) is not in a fake peak.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from tqdm import tqdm

from collect import REPO
from collect.launch.result import RunResult, build_row
from collect.schema import RunSpec
from collect.store import ResultStore
from collect.sweep import SweepSpec, sample_points

FAKE_METHOD = "fake"


def stage_ranks(spec: RunSpec) -> list[int]:
    """The first rank of each pipeline stage (the mesh is pp-major: collect.parallel.mesh)."""
    stride = spec.cluster.world_size // spec.plan.pp
    return [stage * stride for stage in range(spec.plan.pp)]


def trace_point(spec: RunSpec, timeout_s: float) -> tuple[RunResult, dict]:
    """Every stage's first rank traced; the result and the row's extra fields."""
    start, peaks, cpu_s = time.monotonic(), [], 0.0
    ranks = stage_ranks(spec)
    for rank in ranks:
        command = [sys.executable, "-m", "collect.fake.trace", spec.model_dump_json(), "--rank", str(rank)]
        left = timeout_s - (time.monotonic() - start)
        try:
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=max(left, 1))
        except subprocess.TimeoutExpired:
            wall = time.monotonic() - start
            return RunResult("timeout", error=f"rank {rank}: not traced within {timeout_s:.0f} s", wall_s=wall), {}
        if done.returncode != 0:
            why = _last_error(done.stderr)
            return RunResult("error", error=f"rank {rank}: {why}", wall_s=time.monotonic() - start), {}
        traced = json.loads(done.stdout.strip().splitlines()[-1])
        peaks.append(traced["peak_mem_bytes"])
        cpu_s += traced["cpu_s"]
    result = RunResult(
        "ok", peak_mem_bytes_per_rank=peaks, wall_s=time.monotonic() - start, peak_mem_method=FAKE_METHOD
    )
    return result, {"traced_ranks": ranks, "trace_cpu_s": round(cpu_s, 2)}


def _last_error(stderr: str) -> str:
    """The exception's own line: the last line naming an error, without torchrun's rank prefix."""
    lines = [line.removeprefix("[rank0]: ").strip() for line in stderr.strip().splitlines()]
    named = [line for line in lines if "Error" in line or "Exception" in line]
    return (named or lines or ["no output"])[-1][:500]


def run_sweep(spec: SweepSpec, out_dir: Path, limit: int | None, workers: int, timeout_s: float) -> dict:
    store = ResultStore(out_dir / f"{spec.name}.parquet")
    counts = {"ok": 0, "error": 0, "timeout": 0}
    with store.writing():
        done = store.done_ids()
        todo = [p for p in dict.fromkeys(sample_points(spec)) if f"{p.run_id}-fake" not in done][:limit]
        (out_dir / f"{spec.name}.sweep.json").write_text(spec.model_dump_json(indent=2))
        with ThreadPoolExecutor(workers) as pool, tqdm(total=len(todo), desc=spec.name, unit="plan") as bar:
            futures = {pool.submit(trace_point, point, timeout_s): point for point in todo}
            for future in as_completed(futures):
                point = futures[future]
                result, extra = future.result()
                store.append(_row(spec, point, result, extra))
                counts[result.status] += 1
                bar.update()
                bar.set_postfix(counts)
        store.compact()
    return {"traced": sum(counts.values()), **counts, "skipped_done": len(done)}


def _row(spec: SweepSpec, point: RunSpec, result: RunResult, extra: dict) -> dict:
    return build_row(
        point, result, measurement_id=f"{point.run_id}-fake", sweep_id=spec.name, fingerprint_id=None, host=None,
        ref_time_s=None, repeat_group=None, repeat_index=0, is_reference=False,
        **{"traced_ranks": [], "trace_cpu_s": None, **extra},
    )  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collect.fake.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", help="a sweep YAML (collect.sweep.SweepSpec)")
    parser.add_argument("--out", type=Path, default=REPO / "data" / "fake")
    parser.add_argument("--limit", type=int, default=None, help="trace at most this many plans not yet traced")
    parser.add_argument("--workers", type=int, default=1, help="plans traced at once, one process each")
    parser.add_argument("--timeout-s", type=float, default=1800, help="per plan, all its stages")
    args = parser.parse_args(argv)
    spec = SweepSpec.from_yaml(args.sweep)
    args.out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(run_sweep(spec, args.out, args.limit, args.workers, args.timeout_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
