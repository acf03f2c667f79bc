"""Block profile: the measured time of the GPT's own blocks on one rank, plain and under each parallelism.

FLOPs over peak throughput misses most of a small block's time: on one CPU thread a
4-layer, 256-wide GPT's forward and backward take 17 ms where its FLOPs take 5.5 ms,
and DTensor, FSDP2 and checkpointing each add their own per-block dispatch cost (a
64-wide layer: 1.1 ms plain, 7 ms under DTensor on a one-rank mesh). So, as MPE and
vTrain profile layers once and reuse them, the fingerprint times the blocks of
collect.workloads.gpt over a grid of sizes:

- ``block`` points: forward and backward of one attention block (norm, attention,
  residual), one MLP block, the embeddings and the head (norm, output, loss), plain;
  and of a whole layer under each wrapper the collector applies (``LAYER_VARIANTS``:
  checkpointing, FSDP2, DTensor tensor parallelism), built with the collector's own
  ``apply_*`` functions on a one-rank mesh, so what is measured is their software
  cost without communication (the collective curves price that);
- ``optimizer`` points: one AdamW step over a layer's parameters, and over the
  embeddings and head, plain and as DTensors (FSDP, TP);
- multi-rank ``block`` points (``ranks`` > 1, every rank of a pool at once): a layer
  tensor-parallel over all the pool's ranks, collectives real;
- ``concurrency`` points (taken by every rank of a pool at once): a plain layer's
  forward and backward while all ranks compute, so the cost model knows how much
  ranks that share cores slow each other (4 gloo ranks on 2 cores: about 2x).

Raw points are kept; gnn.costs.blocks fits a cost per block and phase to them.
"""

from __future__ import annotations

import itertools
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from collect.parallel.ac import apply_ac
from collect.parallel.dp import apply_fsdp
from collect.parallel.tp import apply_tp
from collect.workloads.gpt import Block, Embeddings, cross_entropy_loss

LAYER_VARIANTS = ("plain", "full", "selective", "fsdp_full", "fsdp_grad_op", "tp", "tp_sp")
OPTIMIZER_VARIANTS = ("plain", "fsdp", "tp")
# (hidden, seq_len, batch) covering the CPU sweeps' shapes (hidden 64-256, 32-64 tokens a micro-batch) and 8x
# beyond them, so the fit extrapolates from measurements, not from nothing
CPU_GRID = list(itertools.product((64, 128, 256, 512), (32, 128), (1, 4)))
# GPU: hidden 8192 took most of the profile's 4 minutes on an H200 (bf16, 2026-11-26); the GPU sweeps' widest is 2048
CUDA_GRID = list(itertools.product((1024, 2048, 4096), (512, 2048), (1, 4)))
CPU_VOCAB, CUDA_VOCAB = 512, 32768
CONCURRENCY_SIZES = ((128, 32, 2), (256, 32, 2))
MIN_BUDGET_REPEATS = 3


def heads_for(hidden: int) -> int:
    return max(1, hidden // 32)  # head dim 32, as the CPU sweeps' widest shape


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # kernels and NCCL collectives return before they finish


def median_time(
    fn, device: torch.device, repeats: int, warmups: int = 2, barrier: bool = False, budget_s: float | None = None
) -> float:
    """The median wall time of ``fn`` over ``repeats`` calls after ``warmups`` (the allocator's, autograd's and
    DTensor's sharding-propagation caches; a collective's connection set-up); ``barrier``: the ranks start each
    call together. ``budget_s``: stop repeating once the samples have taken that long, after at least
    MIN_BUDGET_REPEATS (a CPU's bf16 product of 1024^3 takes ~4 s here, and its median of three was within 3% of
    nine's); one rank only, since ranks that stopped apart would wait on each other's collectives."""
    if budget_s is not None and barrier:
        raise ValueError("budget_s: ranks that start together must repeat alike; give it only without barrier")
    for _ in range(warmups):
        fn()
    samples = []
    for _ in range(repeats):
        if barrier:
            dist.barrier()
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        samples.append(time.perf_counter() - start)
        if budget_s is not None and len(samples) >= MIN_BUDGET_REPEATS and sum(samples) >= budget_s:
            break
    return statistics.median(samples)


def _forward_backward(module_fn, grad_of, device: torch.device, repeats: int) -> tuple[float, float]:
    """(forward, backward) seconds: a forward alone, and a forward and backward less it."""

    def step():
        out = module_fn()
        out.backward(grad_of(out))

    forward = median_time(module_fn, device, repeats)
    both = median_time(step, device, repeats)
    return forward, max(both - forward, 0.0)


class _OneLayer(nn.Module):
    """A GPT with one layer and nothing else: what collect.parallel's apply_* functions expect of a model."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.embeddings = self.norm = self.output = None
        self.layers = nn.ModuleDict({"0": Block(hidden, heads)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers["0"](x)

    def init_weights(self) -> None:
        pass  # values do not change the time


def _layer(variant: str, hidden: int, mesh, device: torch.device, dtype: torch.dtype) -> nn.Module:
    model = _OneLayer(hidden, heads_for(hidden)).to(device, dtype)
    if variant in ("tp", "tp_sp"):
        apply_tp(model, mesh, sequence_parallel=variant == "tp_sp")
    if variant in ("full", "selective"):
        apply_ac(model, variant)
    if variant.startswith("fsdp"):
        apply_fsdp(model, mesh, reshard_after_forward=variant == "fsdp_full")
    return model


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t  # a DTensor output (sequence parallel)


def block_points(grid, vocab: int, device: torch.device, dtype: torch.dtype, repeats: int, mesh) -> list[dict]:
    points = []
    for hidden, seq_len, batch in grid:
        size = {
            "hidden": hidden,
            "heads": heads_for(hidden),
            "seq_len": seq_len,
            "batch": batch,
            "vocab": vocab,
            "dtype": str(dtype).removeprefix("torch."),
        }
        x = torch.randn(batch, seq_len, hidden, device=device, dtype=dtype, requires_grad=True)
        like = lambda out: torch.ones_like(out)
        for block, fn in _plain_blocks(hidden, seq_len, batch, vocab, x, device, dtype).items():
            grad = (lambda out: None) if block == "head" else like
            fwd, bwd = _forward_backward(fn, grad, device, repeats)
            points.append(
                {"kind": "block", "block": block, "variant": "plain", **size, "forward_s": fwd, "backward_s": bwd}
            )
        for variant in LAYER_VARIANTS:
            layer = _layer(variant, hidden, mesh, device, dtype)
            fwd, bwd = _forward_backward(lambda layer=layer: _full(layer(x)), like, device, repeats)
            points.append(
                {"kind": "block", "block": "layer", "variant": variant, **size, "forward_s": fwd, "backward_s": bwd}
            )
            del layer
    return points


def _plain_blocks(hidden, seq_len, batch, vocab, x, device, dtype) -> dict:
    block = Block(hidden, heads_for(hidden)).to(device, dtype)
    embeddings = Embeddings(vocab, hidden, seq_len).to(device, dtype)
    norm, output = nn.LayerNorm(hidden).to(device, dtype), nn.Linear(hidden, vocab, bias=False).to(device, dtype)
    tokens = torch.randint(0, vocab, (batch, seq_len), device=device)
    return {
        "attn": lambda: x + block.attention(block.attention_norm(x)),
        "mlp": lambda: x + block.feed_forward(block.ffn_norm(x)),
        "embed": lambda: embeddings(tokens),
        "head": lambda: cross_entropy_loss(output(norm(x)), tokens),
    }


def optimizer_points(grid, vocab: int, device: torch.device, dtype: torch.dtype, repeats: int, mesh) -> list[dict]:
    """AdamW (the trainer's optimizer) stepping a layer's parameters, or the embeddings' and head's."""
    points = []
    for hidden in sorted({h for h, _, _ in grid}):
        for variant, part in itertools.product(OPTIMIZER_VARIANTS, ("layer", "ends")):
            params = _optimizer_params(variant, part, hidden, vocab, mesh, device, dtype)
            for p in params:
                p.grad = torch.zeros_like(p)
            # CUDA's default foreach step refuses a group mixing DTensors and tensors (a tp layer's norms stay plain)
            mixed = len({isinstance(p, DTensor) for p in params}) > 1
            opt = torch.optim.AdamW(params, lr=1e-4, foreach=False if mixed else None)
            seconds = median_time(opt.step, device, repeats)
            points.append(
                {
                    "kind": "optimizer",
                    "variant": variant,
                    "part": part,
                    "hidden": hidden,
                    "tensors": len(params),
                    "params": sum(_local_numel(p) for p in params),
                    "dtype": str(dtype).removeprefix("torch."),
                    "step_s": seconds,
                }
            )
    return points


def _optimizer_params(variant, part, hidden, vocab, mesh, device, dtype) -> list[nn.Parameter]:
    if part == "layer":
        model = _layer({"plain": "plain", "fsdp": "fsdp_full", "tp": "tp"}[variant], hidden, mesh, device, dtype)
        return list(model.parameters())
    # the embeddings and the head's norm and output projection, as tensors (DTensors: sharded on the mesh)
    ends = nn.ModuleList([Embeddings(vocab, hidden, 128), nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)])
    ends = ends.to(device, dtype)
    if variant != "plain":
        return [nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])) for p in ends.parameters()]
    return list(ends.parameters())


def _local_numel(p: torch.Tensor) -> int:
    return p.to_local().numel() if hasattr(p, "to_local") else p.numel()


def tp_layer_points(device: torch.device, dtype: torch.dtype, repeats: int, grid=None) -> list[dict]:
    """A layer tensor-parallel over every rank of the pool (with and without sequence parallelism), its
    collectives real: DTensor's collective path costs what neither a one-rank mesh nor a raw collective shows
    (a 128-wide layer: 22.6 ms on 2 gloo ranks against 8.3 ms of one-rank compute and 3.1 ms of raw
    all-reduces). Sizes whose heads do not split over the ranks are skipped."""

    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    points = []
    for hidden, seq_len, batch in grid or CPU_GRID:
        if heads_for(hidden) % world or seq_len % world:
            continue
        size = {
            "hidden": hidden,
            "heads": heads_for(hidden),
            "seq_len": seq_len,
            "batch": batch,
            "vocab": CPU_VOCAB,
            "dtype": str(dtype).removeprefix("torch."),
            "ranks": world,
        }
        for variant in ("tp", "tp_sp"):
            # sequence parallel: each rank holds its shard of the sequence, as the embedding hands it on
            local = seq_len // world if variant == "tp_sp" else seq_len
            x = torch.randn(batch, local, hidden, device=device, dtype=dtype, requires_grad=True)
            layer = _layer(variant, hidden, mesh, device, dtype)
            fwd, bwd = _forward_backward(lambda layer=layer: _full(layer(x)), torch.ones_like, device, repeats)
            points.append(
                {"kind": "block", "block": "layer", "variant": variant, **size, "forward_s": fwd, "backward_s": bwd}
            )
            del layer
    return points


def concurrency_points(device: torch.device, dtype: torch.dtype, repeats: int) -> list[dict]:
    """A plain layer's forward and backward timed on every rank at once (ranks start together at a barrier)."""
    points = []
    for hidden, seq_len, batch in CONCURRENCY_SIZES:
        layer = Block(hidden, heads_for(hidden)).to(device, dtype)
        x = torch.randn(batch, seq_len, hidden, device=device, dtype=dtype, requires_grad=True)
        step = lambda: layer(x).backward(torch.ones_like(x))
        if dist.is_initialized():
            dist.barrier()
        seconds = median_time(step, device, repeats)
        points.append(
            {
                "kind": "concurrency",
                "ranks": dist.get_world_size() if dist.is_initialized() else 1,
                "hidden": hidden,
                "seq_len": seq_len,
                "batch": batch,
                "time_s": seconds,
            }
        )
    return points


def measure_block_profile(
    device: torch.device, dtype: torch.dtype = torch.float32, repeats: int = 7, grid=None
) -> list[dict]:
    """Every block and optimizer point, on a one-rank process group (FSDP2 and DTensor run on a mesh over it)."""

    if dist.get_world_size() != 1:
        raise ValueError(f"the block profile runs on one rank, not {dist.get_world_size()}")
    cuda = device.type == "cuda"
    grid = grid or (CUDA_GRID if cuda else CPU_GRID)
    vocab = CUDA_VOCAB if cuda else CPU_VOCAB
    mesh = init_device_mesh(device.type, (1,))
    return block_points(grid, vocab, device, dtype, repeats, mesh) + optimizer_points(
        grid, vocab, device, dtype, repeats, mesh
    )
