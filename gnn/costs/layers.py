"""What one transformer layer computes, keeps and holds, per family, on one rank of a plan.

Forward FLOPs count 2 per multiply-add of every matmul, causal attention unhalved (the GPT formula's convention,
Cheng et al., "Thorough Characterization and Analysis of Large Transformer Model Training At-Scale"). Per token of
a micro-batch on one (tp, cp) rank:
- attention: projections 2d(q + 2kv) + 2qd with q = heads x head_dim, kv = kv_heads x head_dim (grouped-query
  attention shrinks only k and v); scores and their use 4 s q, with s every token of the sequence (under
  context parallelism a rank's queries still meet all keys, passed round the ring);
- MLP: GPT 2 x d x 4d twice; SwiGLU 3 matrices of d x ffn; MoE the router (2 d experts), top_k routed experts
  and the shared ones, each a SwiGLU of expert_ffn_hidden; under expert parallelism the busiest rank computes
  expert_imbalance times the mean.
Kept activations (bytes per token at 2-byte precision, before the dtype's scaling) for GPT are its norms' (as
below), q, k, v and the core's output, and fc1's and GELU's outputs (8d + 2(4d + 8d) / tp). For llama and moe the
tensors torchtitan's blocks save for backward, attention fused (flash, no s^2 scores; plan.attention 'eager' adds
them in gnn.costs.analytic): each norm's input and output (4d; sequence parallelism: _norm_bytes), the core's q,
k and v (k and v repeated to every query head), its output and the output projection's copy of it (2(2q + 3 out);
Nanotron keeps k and v twice: _packed_qkv_bytes); SwiGLU's input and its w1,
silu, w3 and product outputs (4d + 8 ffn); a routed token also keeps its dispatched copy and its expert's output
(4d).
"""

from __future__ import annotations

from dataclasses import dataclass

from collect.schema import Plan, Workload

# What selective recompute keeps is every matmul's and attention's output (LayerShape.selective_bytes, per family
# below); what it runs again in the backward is the pointwise work between them (norms, activations, rotary), a
# small share of a layer's FLOPs: an assumption, not measured.
SELECTIVE_RECOMPUTE_FLOP_SHARE = 0.1


def recompute_flop_share(recompute: str) -> float:
    """Of a layer's forward FLOPs, the share the backward runs again: none, the pointwise work between the kept
    outputs (selective), or all of it (full)."""
    return {"none": 0.0, "selective": SELECTIVE_RECOMPUTE_FLOP_SHARE, "full": 1.0}[recompute]


@dataclass(frozen=True)
class LayerShape:
    """One layer, per token on one rank (FLOPs, bytes at 2-byte precision), averaged over a model's layers where
    dense and MoE layers mix; attention as a share of the weights."""

    attn_flops: float
    mlp_flops: float
    act_bytes: float  # what a layer keeps for backward without recompute
    selective_bytes: float  # what selective recompute keeps: the block's input, every matmul's and attention's output
    params: float  # of one layer on this rank: tp splits matmuls, ep the routed experts
    expert_params: float  # of those, the routed experts' (averaged over the layers, as params)
    attn_share: float  # attention's share of the layer's weights
    attn_gemm_share: float  # of the attention's FLOPs, the projections' (FP8 runs them; not the fused core)
    a2a_elements: float  # per token, one direction of expert parallelism's all-to-all (dispatch or combine)
    ring_elements: float  # per token, the key/value shard a ring-attention step passes on
    mlp_grad_bytes: float = 0.0  # what the MLP's backward holds at once beyond the kept bytes (mlp_grad_bytes below)
    moe_extra_params: float = 0.0  # a MoE layer's weights over a dense one's: what a stage's mix moves (memory.py)


def layer_shape(w: Workload, plan: Plan) -> LayerShape:
    d, t, s = w.hidden, plan.tp, w.seq_len
    if w.family == "gpt":
        attn_flops = 2 * 4 * d * d / t + 4 * s * d / t
        gemm, ring = 8 * d * d / t / attn_flops, 2 * d / t  # ring: k and v
        params = w.layer_params(False) - 13 * d  # the biases and norms, replicated, are added back below
        # q, k, v, the core's output and fc1's split by tp; the row-parallel outputs (wo's, fc2's) whole
        selective = 2 * (_input(d, plan) + (3 * d + d + 4 * d) / t + 2 * d)
        # the norms (as llama's), the core's q, k, v and output, fc1's output and GELU's
        act = _norm_bytes(d, plan) + 2 * 4 * d / t + 2 * 8 * d / t
        params = params / t + 13 * d
        grads = 2 * 2 * 4 * d / t  # fc1's and GELU's outputs' gradients
        return LayerShape(attn_flops, 16 * d * d / t, act, selective, params, 0.0, 1 / 3, gemm, 0.0, ring, grads)
    a = w.attention
    attn_params = a.replicated_params + a.split_params / t  # MLA's down-projections are whole on every tp rank
    attn_flops = 2 * attn_params + a.core_flops(s, t, w.layers)
    gemm, ring = 2 * attn_params / attn_flops, (a.k + a.v) / t  # ring: k and v
    dense = _mlp(d, w.dense_ffn, t)
    # a dense MLP's FLOPs, weights (with the two norms) and kept bytes; a MoE one's below; mixed by MoE's share of
    # the layers, the figures are averages over them
    mlp = (2 * dense, dense + 2 * d, 8 * w.dense_ffn / t, 2 * (2 * w.dense_ffn / t + d))
    moe, a2a, moe_extra = w.moe_layers / w.layers, 0.0, 0.0
    if moe:
        moe_mlp = _moe_mlp(w, plan)
        moe_extra = moe_mlp[1] - mlp[1]
        mlp = tuple((1 - moe) * x + moe * y for x, y in zip(mlp, moe_mlp))
        # a rank dispatches the tokens its expert-tensor group holds: etp / tp of the micro-batch's per tp rank
        a2a = moe * w.top_k * d * (plan.ep - 1) / plan.ep * plan.expert_tp / t
    mlp_flops, mlp_params, mlp_act, mlp_selective = mlp
    # the fused core's inputs (q, and k and v repeated to every query head, as torchtitan's repeat_kv does: widths
    # q and out; the saved v keeps whole the tensor it is a view of, value_storage), its output and the output
    # projection's contiguous copy of it; MLA also keeps its latents (the down-projections' outputs, normed), whole
    kept = 2 * (2 * a.q + 2 * a.out + a.value_storage) / t + 4 * a.latent + _packed_qkv_bytes(a.q, a.k, t, plan)
    act = _norm_bytes(d, plan) + kept + mlp_act
    # selective: the projections' outputs (the latents whole), the core's output, the output projection's whole
    selective = 2 * (_input(d, plan) + a.latent + (a.q + a.k + a.v + a.out) / t + d) + mlp_selective
    params = attn_params + mlp_params
    experts = moe * local_expert_params(w, plan) if moe else 0.0
    grads = mlp_grad_bytes(w, plan)
    shape = (attn_flops, mlp_flops, act, selective, params, experts, attn_params / params, gemm, a2a, ring, grads)
    return LayerShape(*shape, moe_extra_params=moe_extra)


def local_expert_params(w: Workload, plan: Plan) -> float:
    """The routed experts' weights of one MoE layer on one rank: ep splits the experts, expert_tp each one's
    matrices (three of hidden x expert_ffn_hidden)."""
    return w.experts / plan.ep * 3 * w.hidden * w.expert_ffn_hidden / plan.expert_tp


def _input(d: int, plan: Plan) -> float:
    """The block's input, which a checkpoint keeps: sharded over tp under sequence parallelism."""
    return d / plan.tp if plan.sequence_parallel else d


def _moe_mlp(w: Workload, plan: Plan) -> tuple[float, float, float, float]:
    """A MoE MLP's (FLOPs, weights, kept bytes, bytes selective recompute keeps) per micro-batch token on a tp rank:
    selective keeps the router's scores, each expert's matmul outputs (and the shared experts'), and the
    all-to-all's dispatched and combined tokens. Experts are split over etp
    ranks (plan.expert_tp); whatever etp, a tp rank's share of the expert work is 1/tp of its micro-batch's (etp <
    tp: fewer tokens each through whole experts). The shared experts are split like the dense MLP."""
    d, t, et, ffn = w.hidden, plan.tp, plan.expert_tp, w.expert_ffn_hidden
    expert = 3 * d * ffn  # one whole expert's weights
    routed = w.top_k * expert / t * (w.expert_imbalance if plan.ep > 1 else 1.0)
    shared = w.shared_experts * expert / t
    return (
        2 * (routed + shared) + 2 * d * w.experts,  # the router: d x experts, on every token
        w.experts / plan.ep * expert / et + shared + d * w.experts + 2 * d,
        # a routed token keeps its dispatched copy and its expert's output (4d, on the etp ranks that hold it)
        # and the expert's SwiGLU activations (8 ffn, split over etp)
        w.top_k * (4 * d * et + 8 * ffn) / t + w.shared_experts * 8 * ffn / t,
        2 * (w.experts + w.top_k * (2 * ffn / et + d) * et / t + (2 * w.top_k * d * et / t if plan.ep > 1 else 0))
        + (2 * (2 * w.shared_experts * ffn / t + d) if w.shared_experts else 0.0),
    )


def mlp_grad_bytes(w: Workload, plan: Plan) -> float:
    """Per token, bytes at 2-byte precision that one layer's MLP backward holds at once beyond what the layer keeps:
    a SwiGLU's product, silu and w3 outputs' gradients (3 ffn; the fake trace's peak of a middle pipeline stage
    falls there). A MoE layer runs its experts one after another (collect.workloads.moe, a loop, not a grouped
    GEMM), each over its share of the routed token slots, and its shared experts apart: the larger of the two. The
    largest over the layers, dense and MoE alike, as only one layer's backward runs at a time."""
    t, ffn = plan.tp, w.expert_ffn_hidden
    dense = 2 * 3 * w.dense_ffn / t if w.moe_layers < w.layers else 0.0
    if not w.moe_layers:
        return dense
    local = w.experts // plan.ep
    routed = 2 * 3 * w.top_k * ffn / (t * local) * (w.expert_imbalance if plan.ep > 1 else 1.0)
    return max(dense, routed, 2 * 3 * w.shared_experts * ffn / t)


def _norm_bytes(d: int, plan: Plan) -> float:
    """The two norms' inputs and outputs (8d; the output is what the next linear saves). Sequence parallelism
    shards the inputs over tp, and torch's DTensor saves each norm's output gathered whole as the next linear's
    input (4d / tp + 4d), where Megatron and Nanotron keep the output's shard and gather it again in backward
    (plan.sequence_parallel_regather: 8d / tp)."""
    if not plan.sequence_parallel:
        return 8 * d
    return 4 * d / plan.tp + (4 * d / plan.tp if plan.sequence_parallel_regather else 4 * d)


def _packed_qkv_bytes(q: float, kv: float, t: int, plan: Plan) -> float:
    """k and v kept a second time: in the packed q, k, v copy that the saved q is a view of, under multi-head
    attention (plan.attention_keeps_packed_qkv; grouped-query attention copies q out on its own there)."""
    return 2 * 2 * kv / t if plan.attention_keeps_packed_qkv and kv == q else 0.0


def _mlp(d: int, ffn: int, t: int) -> float:
    """Weights of one SwiGLU MLP on a tp rank (and its forward FLOPs per token: twice that)."""
    return 3 * d * ffn / t


def layer_matrices(w: Workload, plan: Plan) -> list[tuple[float, float]]:
    """(rows, columns) of each weight of one layer on a tp rank, rows being the dimension FSDP shards: the collector's
    modules (collect.workloads) under its tensor-parallel plan (collect.parallel.tp: q, k, v, w1 and w3 split by
    rows, wo and w2 by columns). A MoE layer's routed experts are left out (gnn.costs.analytic.fsdp_expert_share)."""
    d, t = w.hidden, plan.tp
    if w.family == "gpt":
        split = [(d / t, d)] * 3 + [(4 * d / t, d)] + [(d / t, 1)] * 3 + [(4 * d / t, 1)]  # with their biases
        return split + [(d, d / t), (d, 4 * d / t)] + [(d, 1)] * 6  # wo and w2 with theirs, two LayerNorms
    a = w.attention
    if w.mla:
        qk, lora = w.qk_nope_head_dim + w.qk_rope_head_dim, w.kv_lora_rank
        query = [(w.q_lora_rank, d), (w.q_lora_rank, 1), (w.heads * qk / t, w.q_lora_rank)] if w.q_lora_rank else []
        attention = (query or [(w.heads * qk / t, d)]) + [(lora + w.qk_rope_head_dim, d), (lora, 1)]
        attention += [(w.heads * (w.qk_nope_head_dim + w.v_head_dim) / t, lora), (d, a.out / t)]
    else:
        attention = [(a.q / t, d), (a.k / t, d), (a.v / t, d), (d, a.out / t)]
    if w.moe_layers:
        shared = w.shared_experts * w.expert_ffn_hidden
        mlp = [(w.experts, d)] + ([(d, shared), (d, shared), (shared, d)] if shared else [])
    else:
        mlp = [(w.dense_ffn / t, d), (w.dense_ffn / t, d), (d, w.dense_ffn / t)]
    return attention + mlp + [(d, 1), (d, 1)]  # the two RMSNorms
