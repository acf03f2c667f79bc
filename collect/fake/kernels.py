"""What a GPU's kernels keep, for a plan of a GPU cluster traced on the CPU under fake tensors.

Two of the collector's ops run other kernels on a GPU than on a CPU, and keep other memory (measured: the H100 rows
of data/memory/h100-single-gpu.jsonl against the CPU's trace of the same plans, experiments/results/gpu_vs_fake.json):
- RMSNorm: CUDA's fused kernel (aten._fused_rms_norm) keeps its input and one fp32 rstd per row for backward; on a
  CPU the norm decomposes into fp32 steps whose intermediates autograd keeps, about 11 bytes per element of a bf16
  input (Llama 3.2 3B at sequence 4,096 without recompute: 40.8 GiB traced on the CPU's kernels, 36.9 on the H100);
- AdamW: on CUDA, torch's default is its foreach kernels, whose intermediates span all of a group's parameters at
  once (one more copy of the weights at the step's peak); on a CPU a loop over the parameters, one at a time
  (Llama 3.1 8B: 61.8 GiB traced on the CPU's, 74.9 on the H100).
- attention whose values are narrower than its queries and keys (multi-head latent attention: 192 against 128 per
  head): CUDA's memory-efficient kernel takes it and keeps q, k, v, the output and one fp32 log-sum-exp per query
  row; the CPU has no fused kernel for it and falls back to the math path, which keeps every head's s x s scores
  (DeepSeek-V3 at sequence 4,096: 8 GiB a layer that no GPU run holds).
``on_gpu()`` makes a trace take the GPU's choices, each with the same memory as the GPU's kernel.
"""

from __future__ import annotations

import contextlib
import importlib
from unittest import mock

import torch
import torch.nn.functional as F

ADAM = importlib.import_module("torch.optim.adam")  # the module: torch.optim's attribute of that name is a function


class FusedRMSNorm(torch.autograd.Function):
    """aten._fused_rms_norm's memory: the output, an fp32 rstd per row, and the input, weight and rstd kept."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = x[..., :1].float()  # the shape and dtype of the kernel's rstd, sharded as x is
        ctx.save_for_backward(x, weight, rstd)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, grad):
        x, weight, _ = ctx.saved_tensors
        return torch.empty_like(x), None if weight is None else torch.empty_like(weight), None


def fused_rms_norm(x, normalized_shape, weight=None, eps=None):
    return FusedRMSNorm.apply(x, weight, eps)


class EfficientAttention(torch.autograd.Function):
    """aten._scaled_dot_product_efficient_attention's memory: the output, and q, k, v, it and an fp32 log-sum-exp per
    query row kept."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = q.new_empty((*q.shape[:-1], v.shape[-1]))
        ctx.save_for_backward(q, k, v, out, q[..., 0].float())
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _attention(sdpa):
    def attention(q, k, v, *args, **kwargs):
        return EfficientAttention.apply(q, k, v) if v.shape[-1] != q.shape[-1] else sdpa(q, k, v, *args, **kwargs)

    return attention


def _foreach_as_on_cuda(params, differentiable, use_fused=False):
    """torch.optim's default on CUDA: the foreach kernels (not fused), unless the step must be differentiable."""
    return False, not differentiable


@contextlib.contextmanager
def on_gpu():
    with (
        mock.patch.object(F, "rms_norm", fused_rms_norm),
        mock.patch.object(ADAM, "_default_to_fused_or_foreach", _foreach_as_on_cuda),
        mock.patch.object(F, "scaled_dot_product_attention", _attention(F.scaled_dot_product_attention)),
    ):
        yield
