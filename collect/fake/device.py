"""What a GPU holds beyond a framework's tensors: a fake-tensor trace, the counting allocator and
torch.cuda.max_memory_allocated all count what the model code allocates; a GPU process holds more, measured on an
H100 beside the traces of 26 single-GPU plans (data/memory/h100-single-gpu.jsonl, experiments/results/
gpu_vs_fake.json): the caching allocator reserved a median 6.7% more than it handed out (0.6-40.5%), and the process
held 1,329 MiB outside it (CUDA's context 527 MiB, cuBLAS's workspace, the kernels). NCCL's buffers, on more than one
GPU, were not measured.

Peaks are learned and predicted as allocated, the quantity every measured row and trace records and frameworks log;
whether a plan fits sets them, with this added, beside the device's memory (gnn.inference.predictor), and
``serve verify`` shows a trace both ways.
"""

from __future__ import annotations

RESERVED_OVER_ALLOCATED = 0.067
OUTSIDE_ALLOCATOR_BYTES = 1329 * 2**20
UNSEEN = "NCCL's buffers, and the caching allocator's gaps beyond the median (up to 40% over what it hands out)"


def on_device(allocated_bytes: float, device: str) -> float:
    """An allocated peak with what the device adds at the median: on a GPU the allocator's reserve and the memory
    held outside it; nothing on a CPU (the collector's counting allocator reads what the trace counts)."""
    return (
        allocated_bytes * (1 + RESERVED_OVER_ALLOCATED) + OUTSIDE_ALLOCATOR_BYTES
        if device == "cuda"
        else allocated_bytes
    )


def allocatable(capacity_bytes: float, device: str) -> float:
    """The largest allocated peak a device of ``capacity_bytes`` holds once it adds what on_device adds: its inverse."""
    return (
        (capacity_bytes - OUTSIDE_ALLOCATOR_BYTES) / (1 + RESERVED_OVER_ALLOCATED)
        if device == "cuda"
        else capacity_bytes
    )
