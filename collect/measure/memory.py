"""Peak memory per rank with allocator-level meaning, the same on every thread and under any load.

CUDA: ``torch.cuda.max_memory_allocated`` after a reset.
CPU: the same quantity from the counting allocator (collect/measure/cpu_alloc.py), which
counts every CPU tensor allocation and free on any thread. The window opens
before the plan builds its model, so every byte the plan allocates is inside
it; the peak is the high-water mark of live bytes less those live at the
start. gloo's worker threads are made to let go of a collective's tensors
before its ``wait()`` returns (collect/measure/gloo_settle.py), as they do on an idle
machine, so the same plan reads the same bytes however busy the machine is.
The RSS high-water mark (VmHWM, reset through /proc/self/clear_refs)
is recorded beside it: it includes the allocator's and the communication
library's own overheads and moves by about 10% between runs.
"""

from __future__ import annotations

import torch

from collect.measure import cpu_alloc, gloo_settle
from collect.schema import Plan


class PeakMemory:
    """``with PeakMemory(device) as mem: ...`` then ``mem.peak_bytes``, ``mem.rss_hwm_bytes``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_bytes = 0
        self.rss_hwm_bytes: int | None = None

    def __enter__(self) -> "PeakMemory":
        _reset_rss_hwm()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            gloo_settle.install()
            cpu_alloc.install()
            cpu_alloc.reset_peak()
            self._base = cpu_alloc.live_bytes()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            self.peak_bytes = cpu_alloc.peak_bytes() - self._base
        self.rss_hwm_bytes = _read_rss_hwm()


PEAK_MEM_METHODS = {"cpu": "counting-allocator", "cuda": "cuda-max-allocated"}
"""Recorded with each row. Older CPU rows carry the profiler's memory events as their method: none (cpu-v1's
first reading, 2026-11-22 00:32-02:21 UTC) summed them as reported; "profiler-events+worker-frees" put back
the frees gloo's worker threads made unreported, by a rule whose result still moved with machine load."""


def affected_by_unreported_frees(plan: Plan) -> bool:
    """Plans whose CPU peak the profiler's events misread, so worth measuring again: FSDP over dp > 1 (gloo's
    reduce-scatter copies, 20 to 100% too high on a 1.98M-parameter GPT) and tensor parallelism (1 to 2%).
    DDP, ZeRO-1 and pipelining gave identical peaks both ways on the same runs."""
    return (plan.fsdp_enabled and plan.dp > 1) or plan.tp > 1


def _reset_rss_hwm() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # not Linux, or not permitted: VmHWM then covers the process lifetime


def _read_rss_hwm() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
