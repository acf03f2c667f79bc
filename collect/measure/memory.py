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
library's own overheads and moves by about 10% between runs. Where the
counting allocator cannot be built (no compiler: collect.measure.cpu_alloc
says what to install), the CPU peak is that high-water mark less the resident
set when the window opened, labelled CPU_FALLBACK_METHOD, never the
allocator's label.
"""

from __future__ import annotations

import torch

from collect.measure import cpu_alloc, gloo_settle
from collect.schema import Plan

PEAK_MEM_METHODS = {"cpu": "counting-allocator", "cuda": "cuda-max-allocated"}
"""Recorded with each row. Older CPU rows carry the profiler's memory events as their method: none (cpu-v1's
first reading, 2026-11-22 00:32-02:21 UTC) summed them as reported; "profiler-events+worker-frees" put back
the frees gloo's worker threads made unreported, by a rule whose result still moved with machine load."""
CPU_FALLBACK_METHOD = "rss-hwm"
"""A CPU peak read without the counting allocator (no compiler to build it): the process's resident-set high-water
mark over the window less its resident set when the window opened. It counts pages, not tensors: the allocator's
and gloo's overheads, and memory the C library keeps after a free, so it reads above the counting allocator."""


class PeakMemory:
    """``with PeakMemory(device) as mem: ...`` then ``mem.peak_bytes``, ``mem.rss_hwm_bytes`` and ``mem.method``
    (how the peak was read: a value of PEAK_MEM_METHODS, or CPU_FALLBACK_METHOD)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_bytes = 0
        self.rss_hwm_bytes: int | None = None
        self.method = PEAK_MEM_METHODS["cuda" if device.type == "cuda" else "cpu"]

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            _reset_rss_hwm()
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        gloo_settle.install()
        counting = cpu_alloc.install()
        reset = _reset_rss_hwm()
        if counting:
            cpu_alloc.reset_peak()
            self._base = cpu_alloc.live_bytes()
            return self
        if not reset:
            raise RuntimeError(
                "no CPU peak can be read: the counting allocator is not built (see the note above) and "
                "/proc/self/clear_refs cannot reset the RSS high-water mark"
            )
        self.method = CPU_FALLBACK_METHOD
        self._base = _read_status_bytes("VmRSS:")
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._base
        elif self.method == PEAK_MEM_METHODS["cpu"]:
            self.peak_bytes = cpu_alloc.peak_bytes() - self._base
        self.rss_hwm_bytes = _read_status_bytes("VmHWM:")
        if self.method == CPU_FALLBACK_METHOD:
            self.peak_bytes = max((self.rss_hwm_bytes or 0) - (self._base or 0), 0)


def affected_by_unreported_frees(plan: Plan) -> bool:
    """Plans whose CPU peak the profiler's events misread, so worth measuring again: FSDP over dp > 1 (gloo's
    reduce-scatter copies, 20 to 100% too high on a 1.98M-parameter GPT) and tensor parallelism (1 to 2%).
    DDP, ZeRO-1 and pipelining gave identical peaks both ways on the same runs."""
    return (plan.fsdp_enabled and plan.dp > 1) or plan.tp > 1


def _reset_rss_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False  # not Linux, or not permitted: VmHWM then covers the process lifetime
    return True


def _read_status_bytes(field: str) -> int | None:
    """A size from /proc/self/status (VmHWM:, VmRSS:), in bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
