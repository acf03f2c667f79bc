"""Peak memory per rank with allocator-level meaning.

CUDA: ``torch.cuda.max_memory_allocated`` after a reset.
CPU: the profiler with ``profile_memory=True`` reports every allocation and
free of the CPU allocator made while it runs (frees of tensors allocated before
it started are not reported). The window opens before the plan builds its
model, so every byte the plan allocates is inside it and the running sum of
those events is exact; its maximum is the peak. The RSS high-water mark
(VmHWM, reset through /proc/self/clear_refs) is recorded beside it: it
includes the allocator's and the communication library's own overheads and
moves by about 10% between runs.
"""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile


class PeakMemory:
    """``with PeakMemory(device) as mem: ...`` then ``mem.peak_bytes``, ``mem.rss_hwm_bytes``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_bytes = 0
        self.rss_hwm_bytes: int | None = None
        self._profiler = None

    def __enter__(self) -> "PeakMemory":
        _reset_rss_hwm()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profiler.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            self._profiler.__exit__(*exc)
            if exc[0] is None:
                self.peak_bytes = _peak_of_memory_events(self._profiler)
            self._profiler = None
        self.rss_hwm_bytes = _read_rss_hwm()


def _peak_of_memory_events(prof) -> int:
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak


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
