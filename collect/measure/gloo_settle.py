"""Make gloo's worker threads let go of a collective's tensors before the caller goes on.

A gloo collective runs on a worker thread, whose handle on the work (and so on
its input, output and any copy the backend made) lives until just after the
work has run, a few microseconds after the caller's ``wait()`` returns, or
milliseconds on a busy machine. When the caller has dropped its own reference
by then, the bytes are freed late and the CPU peak reads higher the busier the
machine is. ``install()`` patches the collectives FSDP2 and DDP call, and
``Work.wait``, so that ``wait()`` returns only once the worker has let go (the
tensors' use counts are back to what they were before the call, plus what the
finished Work object itself keeps for ``result()``), which is what an idle
machine does: the peak then no longer depends on load. On CUDA, NCCL frees
nothing on another thread, and nothing is patched.

What a finished Work keeps (torch 2.13's gloo: one reference on the input, two
on the output) is learned on each collective's first call, by watching the
counts settle for SETTLE_TIMEOUT_S, rather than written down: waiting for the
bare counts instead never ended before the timeout, and added 50 ms to every
FSDP collective.
"""

from __future__ import annotations

import functools
import os
import time

import torch
import torch.distributed as dist

SETTLE_TIMEOUT_S = 0.05  # a worker lets go microseconds after the work ran; past this, give up waiting
_pending: dict[int, tuple] = {}  # id(work) -> (work, op, tensors, use counts before the call)
_work_holds: dict[str, tuple[int, ...]] = {}  # op -> references a finished Work keeps on (output, input)
_PATCHED = {
    "all_gather_single": ("output_tensor", "input_tensor"),
    "reduce_scatter_single": ("output", "input"),
    "all_gather_into_tensor": ("output_tensor", "input_tensor"),
    "reduce_scatter_tensor": ("output", "input"),
}


def _settled(fn, names: tuple[str, str]):
    op = fn.__name__

    @functools.wraps(fn)
    def call(*args, async_op: bool = False, **kwargs):
        tensors = [kwargs[n] if n in kwargs else args[i] for i, n in enumerate(names)]
        before = [t._use_count() for t in tensors]
        work = fn(*args, async_op=True, **kwargs)
        if work is None:
            return None
        _pending[id(work)] = (work, op, tensors, before)
        if async_op:
            return work
        work.wait()
        return None

    return call


def _settling_wait(original):
    @functools.wraps(original)
    def wait(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        entry = _pending.pop(id(self), None)
        if entry is not None:
            _, op, tensors, before = entry
            _settle(op, tensors, before)
        return out

    return wait


def _settle(op: str, tensors: list[torch.Tensor], before: list[int]) -> None:
    holds = _work_holds.get(op)
    target = [b + h for b, h in zip(before, holds)] if holds is not None else None
    lowest = [t._use_count() for t in tensors]
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        counts = [t._use_count() for t in tensors]
        lowest = [min(a, c) for a, c in zip(lowest, counts)]
        if target is not None and all(c <= t for c, t in zip(counts, target)):
            return
        os.sched_yield()
    if holds is None:  # the first call: what the counts settled at is what the Work keeps
        _work_holds[op] = tuple(low - b for low, b in zip(lowest, before))


@functools.cache
def install() -> None:
    for name, names in _PATCHED.items():
        setattr(dist, name, _settled(getattr(dist, name), names))
    work = torch._C._distributed_c10d.Work
    work.wait = _settling_wait(work.wait)
