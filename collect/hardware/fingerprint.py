"""Hardware fingerprint: measured compute and communication facts of the sweep's machine.

Compute (one rank, one thread, as the ranks run; on a GPU, that rank's device): matmul throughput at a few
sizes and dtypes, and memory bandwidth of a large copy. Communication (every
group size the sweep uses): median latency of all-reduce, all-gather,
reduce-scatter, all-to-all and send/recv over message sizes doubling from a few
bytes to the largest used. Raw points are kept; collect.hardware.costmodel fits Lin et
al.'s three-region curve to them. The one-rank pool also takes the block profile
(collect.measure.blocks), and every pool times a layer with all its ranks computing at
once (how much ranks sharing cores slow each other).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from collect.measure.blocks import concurrency_points, measure_block_profile, median_time, tp_layer_points

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
MATMUL_SIZES = (128, 256, 512, 1024)
CUDA_MATMUL_SIZES = (1024, 2048, 4096, 8192)  # a GPU's 1024^3 product takes microseconds: launch-bound
COPY_BYTES, CUDA_COPY_BYTES = 64 * 2**20, 2**30  # a GPU copies 64 MiB in ~30 us
MATMUL_DTYPES = ("float32", "bfloat16")
BLOCK_REPEATS = 5  # a tensor-parallel layer on 4 ranks sharing 2 cores takes up to ~0.2 s
# seconds of samples per compute point: a CPU's bf16 product of 1024^3 takes 2-4 s, fifteen of them most of a minute
COMPUTE_BUDGET_S = 3.0


def message_sizes(max_bytes: int, min_bytes: int = 16) -> list[int]:
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    return sizes


def measure_fingerprint_on_rank(
    max_bytes: int,
    repeats: int = 15,
    blocks: bool = True,
    block_grid: list | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> list[dict]:
    """This rank's points: compute (one rank) or collectives (more), and with ``blocks`` the block profile (one
    rank, over ``block_grid`` or collect.measure.blocks' default) and the concurrency points (every world size).
    ``device``: the CPU (local pool) or this rank's GPU (torchrun); ``dtype``: the blocks' (a GPU sweep's bf16)."""

    world, device = dist.get_world_size(), device or torch.device("cpu")
    if world == 1:
        points = _compute_points(repeats, device)
        points += measure_block_profile(device, dtype, grid=block_grid) if blocks else []
    else:
        points = [
            _collective_point(op, size, world, repeats, device)
            for op in COLLECTIVES
            for size in message_sizes(max_bytes)
        ]
        points += tp_layer_points(device, dtype, BLOCK_REPEATS, block_grid) if blocks else []
    return points + (concurrency_points(device, dtype, repeats) if blocks else [])


def _compute_points(repeats: int, device: torch.device) -> list[dict]:
    points = []
    cuda = device.type == "cuda"
    for dtype in MATMUL_DTYPES:
        for n in CUDA_MATMUL_SIZES if cuda else MATMUL_SIZES:
            a = torch.randn(n, n, device=device).to(getattr(torch, dtype))
            b = torch.randn(n, n, device=device).to(getattr(torch, dtype))
            seconds = median_time(lambda: torch.mm(a, b), device, repeats, warmups=1, budget_s=COMPUTE_BUDGET_S)
            points.append(
                {"kind": "matmul", "dtype": dtype, "n": n, "time_s": seconds, "flops_per_s": 2 * n**3 / seconds}
            )
    src = torch.empty(CUDA_COPY_BYTES if cuda else COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = median_time(lambda: dst.copy_(src), device, repeats, warmups=1, budget_s=COMPUTE_BUDGET_S)
    # a copy reads and writes every byte once
    points.append(
        {"kind": "memory_bandwidth", "bytes": src.numel(), "time_s": seconds, "bytes_per_s": 2 * src.numel() / seconds}
    )
    return points


def _collective_point(op: str, size: int, world: int, repeats: int, device: torch.device) -> dict:
    numel = max(world, size // 4)
    numel -= numel % world  # divisible for the scatter/gather collectives
    x = torch.ones(numel, device=device)
    rank = dist.get_rank()
    if op == "all_reduce":
        fn = lambda: dist.all_reduce(x)
    elif op == "all_gather":
        out = torch.empty(numel * world, device=device)
        fn = lambda: dist.all_gather_single(out, x)
    elif op == "reduce_scatter":
        out = torch.empty(numel // world, device=device)
        fn = lambda: dist.reduce_scatter_single(out, x)
    elif op == "all_to_all":
        out = torch.empty_like(x)
        fn = lambda: dist.all_to_all_single(out, x)
    else:  # send_recv: rank 0 <-> 1 ping, the pipeline's point-to-point pattern
        fn = lambda: _ping(x, rank)
    seconds = median_time(fn, device, repeats, warmups=1, barrier=True)
    return {"kind": "collective", "op": op, "group_size": world, "bytes": numel * 4, "time_s": seconds}


def _ping(x: torch.Tensor, rank: int) -> None:
    if rank == 0:
        dist.send(x, 1)
    elif rank == 1:
        dist.recv(x, 0)
