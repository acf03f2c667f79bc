"""What one transformer layer computes, keeps and holds, per family, on one rank of a plan.

Forward FLOPs count 2 per multiply-add of every matmul, causal attention unhalved (the GPT formula's convention,
../shared/seeds/001). Per token of a micro-batch on one (tp, cp) rank:
- attention: projections 2d(q + 2kv) + 2qd with q = heads x head_dim, kv = kv_heads x head_dim (grouped-query
  attention shrinks only k and v); scores and their use 4 s q, with s every token of the sequence (under
  context parallelism a rank's queries still meet all keys, passed round the ring);
- MLP: GPT 2 x d x 4d twice; SwiGLU 3 matrices of d x ffn; MoE the router (2 d experts), top_k routed experts
  and the shared ones, each a SwiGLU of expert_ffn_hidden; under expert parallelism the busiest rank computes
  expert_imbalance times the mean.
Kept activations (bytes per token at 2-byte precision, before the dtype's scaling) for llama and moe are the
tensors torchtitan's blocks save for backward, attention fused (flash, no s^2 scores; plan.attention 'eager' adds
them in gnn.costs.analytic): each norm's input and output (4d; sequence parallelism: _norm_bytes), q, k, v and
the attention output (2(2q + 2kv); Nanotron keeps k and v twice: _packed_qkv_bytes); SwiGLU's input and its w1,
silu, w3 and product outputs (4d + 8 ffn); a routed token also keeps its dispatched copy and its expert's output
(4d).
"""

from __future__ import annotations

from dataclasses import dataclass

from collect.schema import Plan, Workload


@dataclass(frozen=True)
class LayerShape:
    """One layer, per token on one rank (FLOPs, bytes at 2-byte precision), averaged over a model's layers where
    dense and MoE layers mix; attention as a share of the weights."""

    attn_flops: float
    mlp_flops: float
    act_bytes: float  # the llama/moe activations; GPT's keep Korthikanti's formula (gnn.costs.analytic)
    params: float  # of one layer on this rank: tp splits matmuls, ep the routed experts
    attn_share: float  # attention's share of the layer's weights
    attn_gemm_share: float  # of the attention's FLOPs, the projections' (FP8 runs them; not the fused core)
    a2a_elements: float  # per token, one direction of expert parallelism's all-to-all (dispatch or combine)
    ring_elements: float  # per token, the key/value shard a ring-attention step passes on


def layer_shape(w: Workload, plan: Plan) -> LayerShape:
    d, t, s = w.hidden, plan.tp, w.seq_len
    if w.family == "gpt":
        attn_flops = 2 * 4 * d * d / t + 4 * s * d / t
        gemm, ring = 8 * d * d / t / attn_flops, 2 * d / t  # ring: k and v
        params = w.layer_params(False) - 13 * d  # the biases and norms, replicated, are added back below
        return LayerShape(attn_flops, 16 * d * d / t, 0.0, params / t + 13 * d, 1 / 3, gemm, 0.0, ring)
    a = w.attention
    attn_params = a.replicated_params + a.split_params / t  # MLA's down-projections are whole on every tp rank
    attn_flops = 2 * attn_params + a.core_flops(s, t, w.layers)
    gemm, ring = 2 * attn_params / attn_flops, (a.k + a.v) / t  # ring: k and v
    dense = _mlp(d, w.dense_ffn, t)
    # a dense MLP's FLOPs, weights (with the two norms) and kept bytes; a MoE one's below; mixed by MoE's share of
    # the layers, the figures are averages over them
    mlp = (2 * dense, dense + 2 * d, 8 * w.dense_ffn / t)
    moe, a2a = w.moe_layers / w.layers, 0.0
    if moe:
        mlp = tuple((1 - moe) * x + moe * y for x, y in zip(mlp, _moe_mlp(w, plan)))
        # a rank dispatches the tokens its expert-tensor group holds: etp / tp of the micro-batch's per tp rank
        a2a = moe * w.top_k * d * (plan.ep - 1) / plan.ep * plan.expert_tp / t
    mlp_flops, mlp_params, mlp_act = mlp
    # q, k, v and the core's output; MLA also keeps its latents (the down-projections' outputs, normed), whole
    kept = 2 * (a.q + a.k + a.v + a.out) / t + 4 * a.latent + _packed_qkv_bytes(a.q, a.k, t, plan)
    act = _norm_bytes(d, plan) + kept + mlp_act
    params = attn_params + mlp_params
    return LayerShape(attn_flops, mlp_flops, act, params, attn_params / params, gemm, a2a, ring)


def _moe_mlp(w: Workload, plan: Plan) -> tuple[float, float, float]:
    """A MoE MLP's (FLOPs, weights, kept bytes) per micro-batch token on a tp rank. Experts are split over etp
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
    )


def _norm_bytes(d: int, plan: Plan) -> float:
    """The two norms' inputs and outputs (8d). Sequence parallelism shards them over tp; torch's DTensor then saves
    each norm's gathered output whole as the next linear's input (4d: with tp 2 the same 8d as without it), which
    Megatron and Nanotron gather again in backward (plan.sequence_parallel_regather)."""
    if not plan.sequence_parallel:
        return 8 * d
    return 8 * d / plan.tp + (0 if plan.sequence_parallel_regather else 4 * d)


def _packed_qkv_bytes(q: float, kv: float, t: int, plan: Plan) -> float:
    """k and v kept a second time: in the packed q, k, v copy that the saved q is a view of, under multi-head
    attention (plan.attention_keeps_packed_qkv; grouped-query attention copies q out on its own there)."""
    return 2 * 2 * kv / t if plan.attention_keeps_packed_qkv and kv == q else 0.0


def _mlp(d: int, ffn: int, t: int) -> float:
    """Weights of one SwiGLU MLP on a tp rank (and its forward FLOPs per token: twice that)."""
    return 3 * d * ffn / t
