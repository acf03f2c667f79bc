"""Live and peak bytes of every tensor storage an operation touches, fake or real: the counting allocator's reading
(collect.measure.cpu_alloc) without an allocation.

A storage is counted from the first operation that sees it, as an output or an input, until the garbage collector
frees it, and at its current size: FSDP frees and regrows its unsharded parameters by resizing their storages,
which no operation sees, so ``UntypedStorage.resize_`` is watched too (as torch.distributed._tools.mem_tracker
does). Under fake tensors a functional collective's ``wait_tensor`` returns a new storage where a real run returns
the collective's own output: it is counted as that output, not again. A tensor on the meta device holds no memory
in a real run and is not counted (the model is built and parallelised there before it is materialised: tensor
parallelism's shards made on meta would otherwise count a whole unsharded copy of the weights). On real tensors the
count equals the counting allocator's to the byte (tests/collect/fake/test_trace.py), but for what a kernel allocates
for itself and frees before it returns, which no operation shows: on the CPU, log_softmax and nll_loss_backward
over vocabulary-sharded logits (plan.loss_parallel) each take a temporary the size of the local logits (2.1 MB
beyond the count on 2.1 MB shards, tp 2), where over whole logits they take none.
"""

from __future__ import annotations

import weakref
from collections import Counter

import torch
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

WAIT = torch.ops._c10d_functional.wait_tensor.default


class LiveBytes(TorchDispatchMode):
    """``with LiveBytes() as live: ...`` then ``live.peak`` (bytes) and ``live.now``. ``live.mark(label)`` cuts the
    run into segments: ``live.segments`` holds each segment's peak under (*label, n), its label's n-th mark; what
    comes before the first mark is under ("start",)."""

    def __init__(self):
        super().__init__()
        self.now = self.peak = 0
        self.segments: dict[tuple, int] = {}
        self._segment, self._marks = ("start",), Counter()
        self.segments[self._segment] = 0
        self._shares = WeakIdKeyDictionary()  # storage -> [bytes, live storages sharing them]
        self._refs: set[weakref.ref] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is WAIT:
            (waited,), (returned,) = get_untyped_storages(args[0]), get_untyped_storages(out)
            if returned is not waited and returned not in self._shares and waited in self._shares:
                self._track(returned, self._shares[waited])
        for value in tree_flatten((out, args, kwargs))[0]:
            if isinstance(value, torch.Tensor) and value.device.type != "meta":
                for storage in get_untyped_storages(value):
                    self._see(storage)
        return out

    def mark(self, label: tuple) -> None:
        self._segment = (*label, self._marks[label])
        self._marks[label] += 1
        self.segments[self._segment] = max(self.segments.get(self._segment, 0), self.now)

    def _see(self, storage: torch.UntypedStorage) -> None:
        size, share = storage.nbytes(), self._shares.get(storage)
        if share is None:
            self._track(storage, [size, 0])
            self.now += size
        elif share[0] != size:
            self.now += size - share[0]
            share[0] = size
        self.peak = max(self.peak, self.now)
        self.segments[self._segment] = max(self.segments[self._segment], self.now)

    def _track(self, storage: torch.UntypedStorage, share: list) -> None:
        self._shares[storage] = share
        share[1] += 1

        def freed(ref: weakref.ref) -> None:
            self._refs.discard(ref)
            share[1] -= 1
            if share[1] == 0:
                self.now -= share[0]

        self._refs.add(weakref.ref(storage, freed))

    def __enter__(self) -> "LiveBytes":
        resize = self._resize = torch.UntypedStorage.resize_

        def resized(storage, size):
            out = resize(storage, size)
            if storage in self._shares:
                self._see(storage)
            return out

        torch.UntypedStorage.resize_ = resized
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*exc)
