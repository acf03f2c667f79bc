"""Peak memory per rank with allocator-level meaning.

CUDA: ``torch.cuda.max_memory_allocated`` after a reset.
CPU: the profiler with ``profile_memory=True`` reports every allocation and
free of the CPU allocator made while it runs (frees of tensors allocated before
it started are not reported). The window opens before the plan builds its
model, so every byte the plan allocates is inside it and the running sum of
those events is exact; its maximum is the peak, with one correction (see
``peak_live_bytes``): a free made on a gloo worker thread after its work has
run is not reported, so those are put back where they happen. The RSS high-water mark
(VmHWM, reset through /proc/self/clear_refs) is recorded beside it: it
includes the allocator's and the communication library's own overheads and
moves by about 10% between runs.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from collect.schema import Plan


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


PEAK_MEM_METHODS = {"cpu": "profiler-events+worker-frees", "cuda": "cuda-max-allocated"}
"""Recorded with each row. CPU rows measured before the correction (cpu-v1's first reading, 2026-11-22
00:32-02:21 UTC) have none: their peaks summed the profiler's events without the frees ``peak_live_bytes``
puts back."""


def affected_by_unreported_frees(plan: Plan) -> bool:
    """Plans whose CPU peak the old sum overstated, so worth measuring again: FSDP over dp > 1 (gloo's
    reduce-scatter copies, 20 to 100% too high on a 1.98M-parameter GPT) and tensor parallelism (1 to 2%).
    DDP, ZeRO-1 and pipelining gave identical peaks both ways on the same runs."""
    return (plan.sharding.startswith("fsdp") and plan.dp > 1) or plan.tp > 1


@dataclass(frozen=True)
class Allocation:
    """One event of the CPU allocator: ``nbytes`` > 0 allocates at ``ptr``, < 0 frees it."""

    time_ns: int
    ptr: int
    nbytes: int
    in_collective: bool = False  # made inside a c10d collective call (gloo's copy of its input)


def peak_live_bytes(events: list[Allocation], worker_op_spans: list[tuple[int, int]]) -> int:
    """Peak of live bytes over ``events``, putting back the frees the profiler did not see.

    The profiler reports a free only on a thread it follows. A gloo collective runs on a worker thread,
    and the work holds its tensors (the output, and the copy of its input that reduce-scatter makes inside
    the c10d call) until the worker drops it just after running it. When the caller has let go first,
    that drop frees them unreported, and they look live for good: measured live bytes grew 8 to 15 MB
    per step of an FSDP plan with 2 MB blocks whose RSS stayed flat over 60 steps. So a block freed
    unreported is freed when the first worker-thread op (``worker_op_spans``: (start, end)) that started
    after it was allocated ends. That is known of a block whose address is handed out again with no free
    reported (freed by then at the latest), and of a copy made inside a collective still live at the end.
    Frees of blocks allocated before the window (unknown addresses) are kept as reported.
    """
    spans = sorted(worker_op_spans)
    starts, ends = [start for start, _ in spans], [end for _, end in spans]
    deltas: list[tuple[int, int]] = []  # (time, bytes)
    live: dict[int, Allocation] = {}

    def missed_free(block: Allocation, reused_at: int | None) -> None:
        i = bisect.bisect_left(starts, block.time_ns)
        work_end = ends[i] if i < len(starts) else None
        if reused_at is not None:
            deltas.append((reused_at if work_end is None else min(reused_at, work_end), -block.nbytes))
        elif block.in_collective and work_end is not None:
            deltas.append((work_end, -block.nbytes))

    for event in sorted(events, key=lambda e: e.time_ns):
        if event.nbytes > 0:
            if event.ptr in live:
                missed_free(live.pop(event.ptr), event.time_ns)
            live[event.ptr] = event
        else:
            live.pop(event.ptr, None)
        deltas.append((event.time_ns, event.nbytes))
    for block in live.values():
        missed_free(block, None)
    running = peak = 0
    for _, nbytes in sorted(deltas, key=lambda d: d[0]):
        running += nbytes
        peak = max(peak, running)
    return peak


def _peak_of_memory_events(prof) -> int:
    events, spans = [], []
    stack = [(node, False) for node in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        node, in_collective = stack.pop()
        name = _name(node)
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            events.append(Allocation(node.start_time_ns, fields.ptr, fields.alloc_size, in_collective))
            continue
        if name.startswith("gloo:"):
            spans.append((node.start_time_ns, node.end_time_ns))
        in_collective = in_collective or name.startswith("c10d::")
        stack.extend((child, in_collective) for child in node.children)
    return peak_live_bytes(events, spans)


def _name(node) -> str:
    try:
        return node.name
    except UnicodeDecodeError:  # some Python-frame names arrive undecodable; none of them matter here
        return ""


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
