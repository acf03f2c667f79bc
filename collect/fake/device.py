"""What a GPU adds to a fake-tensor trace: the trace counts what the collector's model code allocates, exactly; a
GPU process holds more, measured on an H100 beside the traces of 26 single-GPU plans (data/memory/
h100-single-gpu.jsonl, experiments/results/gpu_vs_fake.json): the caching allocator reserved a median 6.7% more
than it handed out (0.6-40.5%), and the process held 1,329 MiB outside it (CUDA's context 527 MiB, cuBLAS's
workspace, the kernels). NCCL's buffers, on more than one GPU, were not measured.

``serve verify`` sets a trace beside a prediction with this added; the graph dataset learns the fake rows'
peaks with it added (gnn.dataset.rows.load_fake), so that what is learned is what a GPU holds.
"""

from __future__ import annotations

RESERVED_OVER_ALLOCATED = 0.067
OUTSIDE_ALLOCATOR_BYTES = 1329 * 2**20
UNSEEN = "NCCL's buffers, and the caching allocator's gaps beyond the median (up to 40% over what it hands out)"


def on_device(traced_bytes: float, device: str) -> float:
    """A traced peak with what the device adds at the median: on a GPU the allocator's reserve and the memory held
    outside it; nothing on a CPU (the collector's counting allocator reads what the trace counts)."""
    return traced_bytes * (1 + RESERVED_OVER_ALLOCATED) + OUTSIDE_ALLOCATOR_BYTES if device == "cuda" else traced_bytes
