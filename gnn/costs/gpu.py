"""How long a block runs on a GPU preset: its GEMMs by shape, the fused attention core, the element-wise work by
the bytes it moves, and a gap per kernel.

A datasheet's peak is what the largest GEMMs approach, not what a training step sees: the 1,065 finished H100
runs of the Ultra-Scale Playbook took 3.7x as long as their FLOPs at peak (geometric mean), most where tensor
parallelism or a micro-batch of one makes the GEMMs small. Per block of one micro-batch on one tensor-parallel
rank (m tokens; cp shares the sequence):
- GEMM (m x k) @ (k x n): at the preset's ``gemm_efficiency`` of peak, times the share of the GPU's tiles that hold
  useful work (tile and wave quantization, NVIDIA's Matrix Multiplication Background User's Guide: 128 x 128 output
  tiles, waves of one tile per SM; a skinny output splits k to fill the SMs, as cuBLAS's split-K does), and
  never faster than reading its operands and writing its result at memory bandwidth.
- attention core: 4 s q FLOPs per token counted unhalved (gnn.costs.layers), of which a causal flash kernel runs
  half, at the preset's ``attention_efficiency``; eager attention (plan.attention) runs all of them as two batched
  GEMMs and moves the s x s scores through memory. (A CPU fingerprint's measured blocks are torch's fused SDPA.)
- element-wise work (norms, residual adds, rotary, the MLP's activation, the fp32 cross-entropy): bytes read and
  written at the datasheet bandwidth. Under sequence parallelism a tp rank normalises 1/tp of the tokens.
- a gap per kernel launched (ASSUMED_KERNEL_GAP_S).
The backward runs each GEMM twice (input and weight gradients) and the element-wise work about twice: the node's
FLOPs (2x the forward's) carry it at the forward's seconds per FLOP.

Where the preset names a kernel table (``kernels.table``, measured on its GPU by collect.kernels), each GEMM,
the flash attention core, the element-wise work and the optimizer step take the table's time instead, forward and
backward as measured (collect.kernels.table); what the table lacks keeps the model above, named in
``fallbacks``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from collect.kernels.table import ELEMENTWISE_OPS, KernelTable, load_table
from collect.schema import Plan, Workload

TILE = 128  # output tile edge of cuBLAS/CUTLASS's bf16 kernels (Matrix Multiplication Background User's Guide)
SPLIT_K_MIN = 256  # the shortest k slice a split-K GEMM gives one SM (an assumption, not a published figure)
# an assumption: eager PyTorch launches a kernel every few microseconds at best; a kernel shorter than that leaves
# the GPU idle for the rest (the launch and the Python around it)
ASSUMED_KERNEL_GAP_S = 5e-6
KERNELS = {"attn": 6, "mlp": 5, "head": 4, "embed": 1}  # per forward: norm, GEMMs, rotary, attention, add, ...
# AdamW over fp32 master weights: reads parameter, gradient and both moments, writes all but the gradient, and
# writes the low-precision copy the model computes with: 4 + 4 + 8 read, 4 + 8 + 2 written
OPTIMIZER_BYTES_PER_PARAM = 30
# bytes of one element in the GEMMs' low-precision formats, scales included: FP8 with one scale per tensor or
# row; MXFP8's one E8M0 byte per 32 elements (OCP Microscaling Formats v1.0); NVFP4's half byte and one E4M3
# byte per 16 elements
QUANTISED_BYTES = {"tensorwise": 1.0, "rowwise": 1.0, "mxfp8": 1 + 1 / 32, "nvfp4": 0.5 + 1 / 16}


class Rate(NamedTuple):
    """A GEMM's datasheet FLOP/s and its format's name in a kernel table (bfloat16, float8_tensorwise, ...)."""

    flops_per_s: float
    format: str


@dataclass(frozen=True)
class GpuKernels:
    """A preset's ``kernels`` record: SM count (datasheet) and the efficiencies its sources give, and the kernel
    table it names. ``phase``: what the methods price, a forward or its backward (for_phase)."""

    sms: int
    gemm_efficiency: float
    attention_efficiency: float
    memory_bandwidth: float
    table: KernelTable | None = None
    # a table of the same GPU die whose kernel-to-kernel ratios stand in for sections ``table`` lacks (attention
    # kernels other than torch's own choice): the preset's ``kernels.ratios_from``, with its source
    ratios: KernelTable | None = None
    phase: str = "forward"
    fallbacks: set = field(default_factory=set, compare=False)  # what the table lacked, priced by the datasheet

    @classmethod
    def of(cls, record: dict, memory_bandwidth: float) -> GpuKernels | None:
        k = record.get("kernels")
        if not k:
            return None
        table = load_table(k["table"]) if k.get("table") else None
        ratios = load_table(k["ratios_from"]) if k.get("ratios_from") else None
        sms, gemm, attention = int(k["sms"]), float(k["gemm_efficiency"]), float(k["attention_efficiency"])
        return cls(sms, gemm, attention, memory_bandwidth, table, ratios)

    def for_phase(self, phase: str) -> GpuKernels:
        return dataclasses.replace(self, phase=phase)

    @property
    def datasheet_times(self) -> float:
        """The datasheet model's backward: twice its forward."""
        return 2.0 if self.phase == "backward" else 1.0

    def gemm_seconds(self, m: float, k: float, n: float, rate: Rate, db: float) -> float:
        if self.table is not None and db == 2 and rate.format in self.table.gemm:
            return self.table.gemm_seconds(rate.format, m, k, n, self.phase == "backward")
        if self.table is not None:
            self.fallbacks.add(f"gemm {rate.format} at {db} bytes")
        return self.datasheet_times * self._datasheet_gemm(m, k, n, rate.flops_per_s, db)

    def _datasheet_gemm(self, m: float, k: float, n: float, rate: float, db: float) -> float:
        m, k, n = max(m, 1.0), max(k, 1.0), max(n, 1.0)
        tiles = math.ceil(m / TILE) * math.ceil(n / TILE)
        tile_use = m * n / (tiles * TILE * TILE)
        split = max(1, min(self.sms // tiles, math.ceil(k / SPLIT_K_MIN)))
        units = tiles * split
        wave_use = units / (math.ceil(units / self.sms) * self.sms)
        compute = 2 * m * k * n / (rate * self.gemm_efficiency * tile_use * wave_use)
        memory = db * (m * k + k * n + m * n) / self.memory_bandwidth
        return max(compute, memory) + ASSUMED_KERNEL_GAP_S

    def attention_seconds(
        self, flops: float, rate: Rate, shape: tuple[float, float, float] | None, kernel: str = "sdpa"
    ) -> float:
        """The causal flash core of ``flops`` (unhalved) on ``kernel`` (plan.attention_kernel); ``shape``:
        (sequence, heads, head dim) of one kernel call on a rank, None where the table cannot stand for it (MLA's
        head dims differ)."""
        if self.table is not None and "sdpa" in self.table.attention and shape and rate.format == "bfloat16":
            return self._table_attention(0.5 * flops, shape, kernel)
        if self.table is not None:
            self.fallbacks.add("attention" if shape else "attention with uneven head dims (MLA)")
        return self.datasheet_times * (
            0.5 * flops / (rate.flops_per_s * self.attention_efficiency) + ASSUMED_KERNEL_GAP_S
        )

    def _table_attention(self, causal_flops: float, shape: tuple[float, float, float], kernel: str) -> float:
        backward = self.phase == "backward"
        if kernel in self.table.attention:
            return self.table.attention_seconds(causal_flops, *shape, backward, kernel)
        ratio = self.ratios.attention_ratio(kernel, *shape, backward) if self.ratios is not None else None
        if ratio is None:
            self.fallbacks.add(f"attention kernel {kernel} (priced as torch's own choice)")
            ratio = 1.0
        return ratio * self.table.attention_seconds(causal_flops, *shape, backward)

    def elementwise_seconds(self, op: str, elements: float, nbytes: float, kernels: int) -> float:
        """Element-wise work of kind ``op`` (ELEMENTWISE_OPS) over ``elements``: the table's op there, else
        ``nbytes`` moved at the datasheet bandwidth in ``kernels`` launches."""
        found = ELEMENTWISE_OPS[op]
        if self.table is not None and found in self.table.elementwise:
            return self.table.elementwise_seconds(found, elements, self.phase == "backward")
        if self.table is not None:
            self.fallbacks.add(f"element-wise {found}")
        return self.datasheet_times * (nbytes / self.memory_bandwidth + kernels * ASSUMED_KERNEL_GAP_S)

    def optimizer_seconds(self, params: float) -> float:
        if self.table is not None and self.table.optimizer is not None:
            return self.table.optimizer_seconds(params)
        return params * OPTIMIZER_BYTES_PER_PARAM / self.memory_bandwidth


def forward_seconds(g: GpuKernels, w: Workload, plan: Plan, kind: str, rates: tuple[Rate, Rate], db: int) -> float:
    """One forward of ``kind`` (attn, mlp, head, embed) for one micro-batch on one tp rank. ``rates``: FLOP/s of
    the block's linears (FP8 under float8 training) and of the rest."""
    m, d, t = w.micro_batch_size * w.seq_len / plan.cp, w.hidden, plan.tp
    other = rates[1]
    replicated = m / (t if plan.sequence_parallel else 1)
    if kind == "embed":
        return g.elementwise_seconds("copy", m * d, 2 * m * d * db, KERNELS["embed"])
    if kind == "head":
        logits = m * w.vocab / t  # fp32 logits written, read by the log-softmax, its output read by the loss
        final_norm = 2 * replicated * d * db
        return (
            g.gemm_seconds(m, d, w.vocab / t, other, db)
            + g.elementwise_seconds("cross_entropy", logits, 3 * 4 * logits, 2)
            + g.elementwise_seconds("norm", replicated * d, final_norm, 1)
        )
    seconds = _block_seconds(g, w, plan, kind, m, rates, db)
    return seconds + (_quantise_seconds(g, w, plan, kind, m, db) if w.float8 != "none" else 0.0)


def _block_seconds(g: GpuKernels, w: Workload, plan: Plan, kind: str, m: float, rates, db: int) -> float:
    """An attention or MLP block's forward."""
    d, t, (linear, other) = w.hidden, plan.tp, rates
    replicated = m / (t if plan.sequence_parallel else 1)  # tokens a tp rank normalises and adds
    # the norm reads and writes d, the residual add reads 2d and writes d
    norm_add = g.elementwise_seconds("norm", replicated * d, 2 * replicated * d * db, 1)
    norm_add += g.elementwise_seconds("add", replicated * d, 3 * replicated * d * db, 1)
    if kind == "attn":
        q, k = w.attention.q / t, w.attention.k / t
        return (
            _projection_seconds(g, w, plan, m, linear, db)
            + _core_seconds(g, w, plan, m, other, db)
            + norm_add
            + g.elementwise_seconds("rotary", m * (q + k), 4 * m * (q + k) * db, KERNELS["attn"] - 5)
        )
    return _mlp_seconds(g, w, plan, m, linear, db) + norm_add


def linear_seconds(g: GpuKernels, w: Workload, plan: Plan, kind: str, rate: Rate, db: int) -> float:
    """An attention or MLP block's GEMMs (and the little between them) for one micro-batch on one tp rank."""
    m = w.micro_batch_size * w.seq_len / plan.cp
    if kind == "attn":
        return _projection_seconds(g, w, plan, m, rate, db)
    return _mlp_seconds(g, w, plan, m, rate, db)


def _projection_seconds(g: GpuKernels, w: Workload, plan: Plan, m: float, rate: Rate, db: int) -> float:
    """The attention's projections: q, k and v in one GEMM and the output's (grouped-query attention), or MLA's
    down-projections (whole on every tp rank), their latents' norms and the up-projections (split by heads)."""
    d, t, a = w.hidden, plan.tp, w.attention
    if not w.mla:
        q, kv = a.q / t, a.k / t
        return g.gemm_seconds(m, d, q + 2 * kv, rate, db) + g.gemm_seconds(m, q, d, rate, db)
    h = w.heads / t
    kv_rank, q_rank = w.kv_lora_rank, w.q_lora_rank
    seconds = g.gemm_seconds(m, d, kv_rank + w.qk_rope_head_dim + (q_rank or 0), rate, db)  # both down-projections
    seconds += g.gemm_seconds(m, kv_rank, h * (w.qk_nope_head_dim + w.v_head_dim), rate, db)
    seconds += g.gemm_seconds(m, q_rank or d, a.q / t, rate, db) + g.gemm_seconds(m, a.out / t, d, rate, db)
    return seconds + g.elementwise_seconds("norm", m * a.latent, 2 * m * a.latent * db, 2)  # the latents' norms


def _core_seconds(g: GpuKernels, w: Workload, plan: Plan, m: float, rate: Rate, db: int) -> float:
    """The attention core: fused (causal half, at attention_efficiency), or eager (plan.attention): the scores'
    two batched matmuls over every score at GEMM efficiency, and the scores written, softmaxed in place (read and
    written) and read by the value product."""
    t = plan.tp
    flops = w.attention.core_flops(w.seq_len, t, w.layers) * m
    if plan.attention == "flash":
        a = w.attention
        shape = None if w.mla else (w.seq_len / plan.cp, w.heads / t, a.q / w.heads)
        return g.attention_seconds(flops, rate, shape, plan.attention_kernel)
    scores = m * w.seq_len * w.heads / t
    gemms = g.datasheet_times * flops / (rate.flops_per_s * g.gemm_efficiency)
    return gemms + g.elementwise_seconds("softmax", scores, 4 * scores * db, 3)


def _mlp_seconds(g: GpuKernels, w: Workload, plan: Plan, m: float, rate: Rate, db: int) -> float:
    """The MLP's GEMMs and activation: GPT's GELU MLP, a SwiGLU, or MoE layers mixed with dense ones (each expert
    a SwiGLU over its share of the routed tokens, gathered from every ep rank)."""
    d, t = w.hidden, plan.tp
    if w.mlp == "gelu":
        return (
            g.gemm_seconds(m, d, 4 * d / t, rate, db)
            + g.gemm_seconds(m, 4 * d / t, d, rate, db)
            + g.elementwise_seconds("gelu", m * 4 * d / t, 2 * m * 4 * d / t * db, 1)
        )
    dense = _swiglu_seconds(g, m, d, w.dense_ffn / t, rate, db)
    share = w.moe_layers / w.layers
    if not share:
        return dense
    # the tokens an expert-tensor group routes: the micro-batch gathered over tp where experts split as finely as
    # the attention (etp = tp), a tp rank's share of it where they split less (Megatron's etp < tp)
    et, imbalance = plan.expert_tp, (w.expert_imbalance if plan.ep > 1 else 1.0)
    routes = m * et / t
    per_expert = routes * w.top_k * plan.ep / w.experts * imbalance  # grouped GEMMs at each expert's tokens
    routed = w.experts / plan.ep * _swiglu_seconds(g, per_expert, d, w.expert_ffn_hidden / et, rate, db)
    shared = w.shared_experts * _swiglu_seconds(g, m, d, w.expert_ffn_hidden / t, rate, db)
    # the router, and the dispatcher's permute and unpermute: each routed copy read and written both ways
    permute = 2 * routes * w.top_k * d
    router = g.gemm_seconds(m, d, w.experts, rate, db) + g.elementwise_seconds("copy", permute, 2 * permute * db, 4)
    return (1 - share) * dense + share * (routed + shared + router)


def _swiglu_seconds(g: GpuKernels, m: float, d: float, ffn: float, rate: Rate, db: int) -> float:
    """w1 and w3 (d -> ffn), silu(w1 x) * w3 x (reads 2 ffn, writes ffn), w2 (ffn -> d)."""
    return (
        2 * g.gemm_seconds(m, d, ffn, rate, db)
        + g.gemm_seconds(m, ffn, d, rate, db)
        + g.elementwise_seconds("swiglu", m * ffn, 3 * m * ffn * db, 1)
    )


def _quantise_seconds(g: GpuKernels, w: Workload, plan: Plan, kind: str, m: float, db: int) -> float:
    """Low-precision GEMMs quantise their inputs first: each linear's input read in the model's dtype and written
    twice in the low-precision format (row- and column-wise, as the backward reads it transposed: Transformer
    Engine's MXFP8 and NVFP4 tensors hold both), a kernel per linear; weights are quantised once a step (left
    out). The inputs per token: attention's hidden state and core output (and MLA's latents), the MLP's hidden
    state and activation (a MoE layer's per routed copy)."""
    d, t, write = w.hidden, plan.tp, 2 * QUANTISED_BYTES[w.float8]
    if kind == "attn":
        elements, linears = d + w.attention.out / t + w.attention.latent, 2 + 2 * w.mla
    elif w.mlp == "gelu":
        elements, linears = d + 4 * d / t, 2
    else:
        share, elements, linears = w.moe_layers / w.layers, d + w.dense_ffn / t, 3
        if share:
            ffn = w.expert_ffn_hidden
            routed = w.top_k * plan.expert_tp / t * (d + ffn / plan.expert_tp) + w.shared_experts * (d + ffn / t)
            elements = (1 - share) * elements + share * routed
    return g.elementwise_seconds("copy", m * elements, m * elements * (db + write), linears)
