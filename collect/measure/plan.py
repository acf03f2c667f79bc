"""Measure one plan on this rank: peak memory while building and stepping, then timed steps.

An iteration is bracketed by a barrier before it; each rank times its own
step and the iteration's time is the max over ranks (taken by the caller).
"""

from __future__ import annotations

import gc
import time

import torch
import torch.distributed as dist
from pydantic import BaseModel, Field

from collect.measure.memory import PeakMemory
from collect.measure.trainer import PlanTrainer
from collect.schema import RunSpec


class MeasureSettings(BaseModel):
    """How each plan is measured."""

    warmup_iters: int = Field(default=2, ge=0)
    """Untimed steps after the memory window (which itself holds two steps)."""
    timed_iters: int = Field(default=5, ge=1)
    """Timed steps; the row keeps their median, p10, p90 and the raw list."""
    memory_window_iters: int = Field(default=2, ge=1)
    """Steps inside the memory window: the second runs with optimizer state allocated."""
    pin_cores: bool = False
    """Local pool: pin rank r to the r-th usable core when there are at least as many cores as ranks (on a busy
    VM it trades the scheduler's balancing for no migrations; the noise floor of a sweep tells which was better)."""


def measure_on_rank(spec: RunSpec, device: torch.device, settings: MeasureSettings) -> dict:
    with PeakMemory(device) as mem:
        trainer = PlanTrainer(spec, device)
        for _ in range(settings.memory_window_iters):
            trainer.step()
    for _ in range(settings.warmup_iters):
        trainer.step()
    times = []
    for _ in range(settings.timed_iters):
        dist.barrier()
        _sync(device)
        start = time.perf_counter()
        trainer.step()
        _sync(device)
        times.append(time.perf_counter() - start)
    trainer.close()
    del trainer
    gc.collect()
    return {
        "times": times,
        "peak_mem_bytes": mem.peak_bytes,
        "rss_hwm_bytes": mem.rss_hwm_bytes,
        "peak_mem_method": mem.method,
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
