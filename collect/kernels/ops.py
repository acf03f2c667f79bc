"""The operators a kernel table times, one section each; every section yields rows (lists, in the order its
``COLUMNS`` name) and skips a point that does not fit or that the device cannot run, saying why once.

GEMMs are timed as an nn.Linear runs them: x (m, k) by a weight (n, k) forward, and its two backward GEMMs, the
input gradient g (m, n) @ w and the weight gradient g^T @ x. The rest by autograd, forward and backward apart.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from collect.kernels.grid import Grid
from collect.kernels.timer import seconds_per_call

COLUMNS = {
    "gemm": ["m", "k", "n", "forward_s", "dgrad_s", "wgrad_s"],
    "grouped_gemm": ["experts", "tokens", "k", "n", "forward_s", "dgrad_s", "wgrad_s"],
    "attention": ["seq", "heads", "head_dim", "forward_s", "backward_s"],
    "elementwise": ["op", "tokens", "width", "bytes", "forward_s", "backward_s"],
    "optimizer": ["impl", "params", "tensors", "step_s"],
}


def _randn(*shape, device, dtype=torch.bfloat16, grad=False):
    return torch.randn(*shape, device=device, dtype=dtype).requires_grad_(grad)


def _gemm_shapes(grid: Grid) -> Iterator[tuple[int, int, int]]:
    """(m, k, n) of the grid whose operands and result fit its size cap."""
    for m, k, n in itertools.product(grid.gemm_m, grid.gemm_kn, grid.gemm_kn):
        if max(m * k, k * n, m * n) <= grid.max_elements:
            yield m, k, n


def gemm(grid: Grid, device, dtype) -> Iterator[list]:
    for m, k, n in _gemm_shapes(grid):
        x, w = _randn(m, k, device=device, dtype=dtype), _randn(n, k, device=device, dtype=dtype)
        g = _randn(m, n, device=device, dtype=dtype)
        yield [
            m,
            k,
            n,
            seconds_per_call(lambda: torch.mm(x, w.t()), device),
            seconds_per_call(lambda: torch.mm(g, w), device),
            seconds_per_call(lambda: torch.mm(g.t(), x), device),
        ]


def gemm_fp8(grid: Grid, device, scaling: str) -> Iterator[list]:
    """torch._scaled_mm in e4m3 (torchao's float8 training): tensorwise or rowwise scales, the forward with fast
    accumulation and the backward without (torchao's defaults). Each operand is laid out as the kernel needs it
    beforehand, as float8 training keeps its transposed copies."""
    e4m3 = torch.float8_e4m3fn
    for m, k, n in _gemm_shapes(grid):
        x = _randn(m, k, device=device).to(e4m3)
        w = _randn(n, k, device=device).to(e4m3)
        g = _randn(m, n, device=device).to(e4m3)
        w_t, g_t, x_t = w.t().contiguous(), g.t().contiguous(), x.t().contiguous()

        def mm(a, b, fast):
            rows, cols = a.shape[0], b.shape[1]
            if scaling == "rowwise":
                sa = torch.ones(rows, 1, device=device, dtype=torch.float32)
                sb = torch.ones(1, cols, device=device, dtype=torch.float32)
            else:
                sa = sb = torch.ones((), device=device, dtype=torch.float32)
            return lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast)

        yield [
            m,
            k,
            n,
            seconds_per_call(mm(x, w.t(), True), device),
            seconds_per_call(mm(g, w_t.t(), False), device),
            seconds_per_call(mm(g_t, x_t.t(), False), device),
        ]


def grouped_gemm(grid: Grid, device, dtype) -> Iterator[list]:
    """torch._grouped_mm as torchtitan's MoE calls it: every routed token's row against its expert's weight, the
    experts' tokens contiguous (equal counts here); the backward's input gradient and per-expert weight
    gradient."""
    shapes = {(d, f) for d, f in grid.grouped_kn} | {(f, d) for d, f in grid.grouped_kn}
    for e, t, (k, n) in itertools.product(grid.grouped_experts, grid.grouped_tokens, sorted(shapes)):
        rows = e * t
        if max(rows * k, rows * n, e * k * n) > grid.max_elements:
            continue
        x, g = _randn(rows, k, device=device, dtype=dtype), _randn(rows, n, device=device, dtype=dtype)
        w = _randn(e, n, k, device=device, dtype=dtype)
        w_t, g_t, x_t = w.transpose(-2, -1).contiguous(), g.t().contiguous(), x.t().contiguous()
        offs = torch.arange(t, rows + 1, t, device=device, dtype=torch.int32)
        yield [
            e,
            t,
            k,
            n,
            seconds_per_call(lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs), device),
            seconds_per_call(lambda: torch._grouped_mm(g, w_t.transpose(-2, -1), offs=offs), device),
            seconds_per_call(lambda: torch._grouped_mm(g_t, x_t.t(), offs=offs), device),
        ]


# attention kernels by the name a table files them under: torch's own choice, or one backend forced. torch's flash
# backend is FlashAttention-2's code (what Nanotron calls through flash_attn); cuDNN's fused attention is what
# Transformer Engine runs on Hopper (Megatron, NeMo)
ATTENTION_BACKENDS = {"sdpa": None, "flash2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def attention(grid: Grid, device, dtype, kernel: str = "sdpa") -> Iterator[list]:
    """Causal scaled-dot-product attention at batch 1 on ``kernel``'s backend (sdpa: the one torch picks)."""
    backend = ATTENTION_BACKENDS[kernel]
    for s, h, hd in itertools.product(grid.attention_seq, grid.attention_heads, grid.head_dims):
        if h * s * hd > grid.max_elements:
            continue
        with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():  # not held across a yield
            q, k, v = (_randn(1, h, s, hd, device=device, dtype=dtype, grad=True) for _ in range(3))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            grad = torch.randn_like(out)
            forward = seconds_per_call(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device)
            backward = seconds_per_call(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), device)
        yield [s, h, hd, forward, backward]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


ELEMENTWISE = {  # op -> (inputs of width w it reads, outputs of width w it writes, its function)
    "rms_norm": (1, 1, lambda x, wt: F.rms_norm(x, (x.shape[-1],), wt)),
    "swiglu": (2, 1, lambda a, b: F.silu(a) * b),
    "add": (2, 1, lambda a, b: a + b),
    "rotary": (1, 1, lambda x, cs: _rotate(x, cs, cs)),
}


def elementwise(grid: Grid, device, dtype) -> Iterator[list]:
    """Norms, SwiGLU's gate, residual adds and rotary at (tokens, width), and the fp32 cross-entropy of a
    vocabulary shard (its logits upcast from the model's dtype, as the collector's loss does); ``bytes`` is what
    the forward reads and writes."""
    size = torch.tensor([], dtype=dtype).element_size()
    for (op, (reads, writes, fn)), m, w in itertools.product(
        ELEMENTWISE.items(), grid.elementwise_tokens, grid.elementwise_widths
    ):
        if m * w > grid.max_elements:
            continue
        a = _randn(m, w, device=device, dtype=dtype, grad=True)
        b = _second(op, m, w, device, dtype)
        yield _forward_backward(op, m, w, (reads + writes) * m * w * size, lambda: fn(a, b), (a, b), device)
    for m, v in itertools.product(grid.elementwise_tokens, grid.vocab_shards):
        if m * v > grid.max_elements:
            continue
        logits = _randn(m, v, device=device, dtype=dtype, grad=True)
        target = torch.randint(0, v, (m,), device=device)
        fn = lambda: F.cross_entropy(logits.float(), target)  # noqa: E731
        yield _forward_backward("cross_entropy", m, v, m * v * (size + 4), fn, (logits,), device)


def _second(op: str, m: int, w: int, device, dtype) -> torch.Tensor:
    """The op's other operand: the norm's weight, rotary's position table (no gradient), else a second input."""
    if op == "rms_norm":
        return _randn(w, device=device, dtype=dtype, grad=True)
    return _randn(m, w, device=device, dtype=dtype, grad=op != "rotary")


def _forward_backward(op, m, w, nbytes, fn, inputs, device) -> list:
    out = fn()
    grad = torch.ones_like(out)
    needs = tuple(t for t in inputs if t.requires_grad)
    backward = seconds_per_call(lambda: torch.autograd.grad(out, needs, grad, retain_graph=True), device)
    return [op, m, w, nbytes, seconds_per_call(fn, device), backward]


def optimizer(grid: Grid, device) -> Iterator[list]:
    """One AdamW step over fp32 parameters split in 64 tensors: fused (one kernel) where the device has it, and
    foreach (a kernel per operation over every tensor)."""
    impls = ["fused", "foreach"] if device.type == "cuda" else ["foreach"]
    for impl, p in itertools.product(impls, grid.optimizer_params):
        params = [torch.nn.Parameter(torch.randn(p // 64, device=device)) for _ in range(64)]
        for t in params:
            t.grad = torch.randn_like(t)
        opt = torch.optim.AdamW(params, lr=1e-4, **{impl: True})
        yield [impl, p, len(params), seconds_per_call(opt.step, device)]
