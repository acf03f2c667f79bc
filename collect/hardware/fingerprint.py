"""Hardware fingerprint: measured compute and communication facts of the sweep's machine.

Compute (one rank, one thread, as the ranks run): matmul throughput at a few
sizes and dtypes, and memory bandwidth of a large copy. Communication (every
group size the sweep uses): median latency of all-reduce, all-gather,
reduce-scatter, all-to-all and send/recv over message sizes doubling from a few
bytes to the largest used. Raw points are kept; collect.hardware.costmodel fits Lin et
al.'s three-region curve to them. The one-rank pool also takes the block profile
(collect.measure.blocks), and every pool times a layer with all its ranks computing at
once (how much ranks sharing cores slow each other).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from collect.measure.blocks import concurrency_points, measure_block_profile, tp_layer_points

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
MATMUL_SIZES = (128, 256, 512, 1024)
MATMUL_DTYPES = ("float32", "bfloat16")
BLOCK_REPEATS = 5  # a tensor-parallel layer on 4 ranks sharing 2 cores takes up to ~0.2 s


def message_sizes(max_bytes: int, min_bytes: int = 16) -> list[int]:
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= 4
    return sizes


def measure_fingerprint_on_rank(
    max_bytes: int, repeats: int = 15, blocks: bool = True, block_grid: list | None = None
) -> list[dict]:
    """This rank's points: compute (one rank) or collectives (more), and with ``blocks`` the block profile (one
    rank, over ``block_grid`` or collect.measure.blocks' default) and the concurrency points (every world size)."""

    world, cpu = dist.get_world_size(), torch.device("cpu")
    if world == 1:
        points = _compute_points(repeats) + (measure_block_profile(cpu, grid=block_grid) if blocks else [])
    else:
        points = [
            _collective_point(op, size, world, repeats) for op in COLLECTIVES for size in message_sizes(max_bytes)
        ]
        points += tp_layer_points(cpu, torch.float32, BLOCK_REPEATS, block_grid) if blocks else []
    return points + (concurrency_points(cpu, torch.float32, repeats) if blocks else [])


def _time(fn, repeats: int, barrier: bool) -> float:
    fn()  # warm-up: first call pays connection and allocation set-up
    samples = []
    for _ in range(repeats):
        if barrier:
            dist.barrier()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _compute_points(repeats: int) -> list[dict]:
    points = []
    for dtype in MATMUL_DTYPES:
        for n in MATMUL_SIZES:
            a = torch.randn(n, n).to(getattr(torch, dtype))
            b = torch.randn(n, n).to(getattr(torch, dtype))
            seconds = _time(lambda: torch.mm(a, b), repeats, barrier=False)
            points.append(
                {"kind": "matmul", "dtype": dtype, "n": n, "time_s": seconds, "flops_per_s": 2 * n**3 / seconds}
            )
    src = torch.empty(64 * 2**20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    seconds = _time(lambda: dst.copy_(src), repeats, barrier=False)
    # a copy reads and writes every byte once
    points.append(
        {"kind": "memory_bandwidth", "bytes": src.numel(), "time_s": seconds, "bytes_per_s": 2 * src.numel() / seconds}
    )
    return points


def _collective_point(op: str, size: int, world: int, repeats: int) -> dict:
    numel = max(world, size // 4)
    numel -= numel % world  # divisible for the scatter/gather collectives
    x = torch.ones(numel)
    rank = dist.get_rank()
    if op == "all_reduce":
        fn = lambda: dist.all_reduce(x)
    elif op == "all_gather":
        out = torch.empty(numel * world)
        fn = lambda: dist.all_gather_single(out, x)
    elif op == "reduce_scatter":
        out = torch.empty(numel // world)
        fn = lambda: dist.reduce_scatter_single(out, x)
    elif op == "all_to_all":
        out = torch.empty_like(x)
        fn = lambda: dist.all_to_all_single(out, x)
    else:  # send_recv: rank 0 <-> 1 ping, the pipeline's point-to-point pattern
        fn = lambda: _ping(x, rank)
    seconds = _time(fn, repeats, barrier=True)
    return {"kind": "collective", "op": op, "group_size": world, "bytes": numel * 4, "time_s": seconds}


def _ping(x: torch.Tensor, rank: int) -> None:
    if rank == 0:
        dist.send(x, 1)
    elif rank == 1:
        dist.recv(x, 0)
