"""Timing one kernel call: back-to-back calls in batches long enough for the clock, the median batch's mean.

Back-to-back calls are what an eager training step runs: for a long kernel the launch hides behind the previous
call, for a short one the launch is the time (what a step sees too). Operands stay in the GPU's L2 cache between
calls where they fit (50 MiB on an H100), which flatters the smallest memory-bound kernels only.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

MIN_BATCH_S = 2e-3  # a batch's length: well above perf_counter's resolution and one synchronize
MAX_CALLS = 64
BATCHES = 3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(fn, device: torch.device) -> float:
    fn()  # warm-up: the first call picks the kernel and allocates its workspace
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    single = time.perf_counter() - start
    calls = max(1, min(MAX_CALLS, math.ceil(MIN_BATCH_S / max(single, 1e-7))))
    samples = []
    for _ in range(BATCHES):
        sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(device)
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def launch_seconds(device: torch.device) -> float:
    """One tiny kernel's cost when launched back to back: eager PyTorch's launch rate on this host."""
    x = torch.zeros(1, device=device)
    return seconds_per_call(lambda: x.add_(1.0), device)
