"""Where a real training step's time goes on one GPU, beside what a kernel table says its operators cost.

    torchrun --nproc_per_node 1 -m experiments.kernels.gpu_step --sweep SWEEP.yaml --out FILE.json [--sustained]

For each plan of a sweep's explicit points (one rank, the collector's own PlanTrainer), after warm-up steps: the
wall time of timed steps, then one step under torch.profiler. Its GPU kernels are summed by kind (GEMM, attention,
optimizer, copies, the rest) and by operator and input shape (``aten::mm`` at (m, k) x (k, n), ...), and the GPU's
busy time (the union of kernel intervals) is set against the step's wall time: what is left is the time the GPU
waited for the host. experiments.kernels.step_gap prices the same operators from the table and compares.

``--sustained`` also times one large bf16 GEMM the way the table does (a few ms of back-to-back calls after idle)
and then continuously for 20 s, reporting throughput per second: whether a sustained step runs at the clock a
short burst sees. Run ``nvidia-smi --query-gpu=... -lms 500`` beside it for the clocks and power.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import yaml
from torch.profiler import ProfilerActivity, profile

from collect.kernels.timer import seconds_per_call, sync
from collect.launch.torchrun import init_torchrun
from collect.measure.trainer import PlanTrainer
from collect.schema import RunSpec

# kernel name patterns, first match wins (CUTLASS/cuBLAS GEMMs on Hopper: sm90_xmma, nvjet, cutlass)
KINDS = [
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|xmma|nvjet|cutlass|matmul|_mm_", re.I)),
    ("optimizer", re.compile(r"multi_tensor|adam|foreach", re.I)),
    ("nccl", re.compile(r"nccl", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy|cat_|index|gather|scatter", re.I)),
    ("softmax_loss", re.compile(r"softmax|nll|cross_entropy|log_softmax", re.I)),
]


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """The union of [start, end) intervals, in their unit."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def profile_step(trainer: PlanTrainer, device: torch.device) -> dict:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=activities, record_shapes=True) as prof:
        start = time.perf_counter()
        trainer.step()
        sync(device)
        wall = time.perf_counter() - start
    kernels, intervals = {}, []
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        intervals.append((e.time_range.start, e.time_range.end))
        k = kernels.setdefault(e.name, {"name": e.name, "kind": kind_of(e.name), "count": 0, "us": 0.0})
        k["count"] += 1
        k["us"] += e.time_range.elapsed_us()
    by_kind: dict[str, float] = {}
    for k in kernels.values():
        by_kind[k["kind"]] = by_kind.get(k["kind"], 0.0) + k["us"] * 1e-6
    ops = []
    for a in prof.key_averages(group_by_input_shape=True):
        device_us = getattr(a, "device_time_total", 0.0)
        if device_us > 0 or device.type != "cuda":
            ops.append({"op": a.key, "shapes": str(a.input_shapes), "count": a.count, "device_us": device_us,
                        "cpu_us": a.cpu_time_total})  # fmt: skip
    ops.sort(key=lambda o: -(o["device_us"] or o["cpu_us"]))
    return {
        "profiled_wall_s": wall,
        "gpu_busy_s": busy_seconds(intervals) * 1e-6,
        "kernel_s_by_kind": {k: round(v, 6) for k, v in sorted(by_kind.items())},
        "kernel_launches": sum(k["count"] for k in kernels.values()),
        "kernels": sorted(kernels.values(), key=lambda k: -k["us"])[:60],
        "ops": ops[:120],
    }


def measure_plan(spec: RunSpec, device: torch.device, warmup: int, timed: int) -> dict:
    trainer = PlanTrainer(spec, device)
    for _ in range(warmup):
        trainer.step()
    times = []
    for _ in range(timed):
        sync(device)
        start = time.perf_counter()
        trainer.step()
        sync(device)
        times.append(time.perf_counter() - start)
    found = {"run_id": spec.run_id, "spec": spec.model_dump(mode="json"), "step_s": times}
    found["step_median_s"] = statistics.median(times)
    found |= profile_step(trainer, device)
    trainer.close()
    del trainer
    if device.type == "cuda":
        torch.cuda.empty_cache()
        found["max_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    return found


def sustained(device: torch.device, size: int, seconds: float) -> dict:
    """One (size x size) bf16 GEMM as the table times it, then back to back for ``seconds``, per second."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    flop = 2 * size**3
    time.sleep(3.0)  # idle first, as the table's points follow other small work
    burst = seconds_per_call(lambda: torch.mm(a, b), device)
    windows, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < 1.0:
            for _ in range(20):
                torch.mm(a, b)
            sync(device)
            n += 20
        windows.append(flop * n / (time.perf_counter() - t0))
    return {"size": size, "burst_flop_per_s": flop / burst, "per_second_flop_per_s": windows}


def points(sweep: Path) -> list[RunSpec]:
    found = yaml.safe_load(sweep.read_text())
    if not found.get("points"):
        raise SystemExit(f"error: {sweep}: points: this script takes a sweep of explicit points")
    return [RunSpec.model_validate(p) for p in found["points"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timed", type=int, default=5)
    parser.add_argument("--sustained", action="store_true")
    args = parser.parse_args()
    device = init_torchrun(timeout_s=600)
    report: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "plans": []}
    report["torch"] = torch.__version__
    if args.sustained and device.type == "cuda":
        report["sustained"] = [sustained(device, 8192, 20.0)]
        args.out.write_text(json.dumps(report, indent=1))
    for spec in points(args.sweep):
        try:
            report["plans"].append(measure_plan(spec, device, args.warmup, args.timed))
        except Exception as e:  # an OOM or a kernel this torch lacks: the others still run
            report["plans"].append({"run_id": spec.run_id, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            if device.type == "cuda":
                torch.cuda.empty_cache()
        print(json.dumps({k: v for k, v in report["plans"][-1].items() if k not in ("kernels", "ops", "spec")}))
        args.out.write_text(json.dumps(report, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
