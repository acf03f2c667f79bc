"""Analytic per-block costs of the GPT of collect.workloads.gpt under a plan.

Formulas from the transformer characterisation (../shared/seeds/001): per
layer 12d^2 parameters; forward matmul FLOPs 24 b s d^2 + 4 b s^2 d per layer
(the b(72sd^2 + 12s^2d) per training step, over three passes); activation bytes
b(34 s d + 5 a s^2) per layer at 2-byte precision (Korthikanti et al.), scaled
by the dtype. Tensor parallelism divides the matmul FLOPs and most activation
bytes by tp (not the logits: the head's output is gathered); full recompute
keeps only each block's input.
"""

from __future__ import annotations

from dataclasses import dataclass

from collect.schema import DTYPE_BYTES, Plan, Workload

ADAM_STATE_BYTES = 8  # two fp32 moments per parameter


@dataclass(frozen=True)
class BlockCosts:
    """Per micro-batch, per tensor-parallel rank."""

    attn_flops: float
    mlp_flops: float
    head_flops: float
    activation_bytes_per_layer: float  # stored for backward, without recompute
    boundary_bytes: float  # one hidden-state tensor b*s*d (pipeline p2p, TP collective message)
    logits_bytes: float
    layer_params: float  # parameters of one layer on this tp rank
    embed_params: float
    head_params: float


def dtype_bytes(w: Workload) -> int:
    return DTYPE_BYTES.get(w.dtype or "bfloat16", 2)


def block_costs(w: Workload, plan: Plan) -> BlockCosts:
    b, s, d, a, v = w.micro_batch_size, w.seq_len, w.hidden, w.heads, w.vocab
    t, db = plan.tp, dtype_bytes(w)
    act = s * b * d * (34 + 5 * a * s / d) * db / 2  # Korthikanti's bytes at 2-byte precision, scaled
    if t > 1:  # norms and dropout inputs stay replicated unless sequence parallel
        sharded = s * b * d * (24 + 5 * a * s / d) * db / 2
        act = (act - sharded) / (t if plan.sequence_parallel else 1) + sharded / t
    return BlockCosts(
        attn_flops=(8 * b * s * d * d + 4 * b * s * s * d) / t,
        mlp_flops=16 * b * s * d * d / t,
        head_flops=2 * b * s * d * v / t,
        activation_bytes_per_layer=act,
        boundary_bytes=b * s * d * db,
        # cross-entropy runs in fp32 on the whole vocabulary: the TP head is ColwiseParallel with a replicated
        # output (collect/parallel/tp.py, no loss parallelism), so every rank holds all the logits
        logits_bytes=b * s * v * 4,
        layer_params=(12 * d * d) / t + 13 * d,
        embed_params=(v * d) / t + s * d,
        head_params=(v * d) / t + 2 * d,
    )


def block_features(c: BlockCosts, block: str, db: int) -> tuple[float, float, float]:
    """(FLOPs, weight bytes, activation bytes) of one block for one micro-batch on one tensor-parallel rank: what
    gnn.costs.blocks's measured costs are fitted to. Blocks: attn, mlp, layer (both), embed, head. A layer's weights
    are a third attention (q, k, v, o: 4d^2) and two thirds MLP (8d^2); activations are the hidden state a block
    reads (the head: its fp32 logits)."""
    if block == "embed":
        return 0.0, c.embed_params * db, c.boundary_bytes
    if block == "head":
        return c.head_flops, c.head_params * db, c.logits_bytes
    share = {"attn": 1 / 3, "mlp": 2 / 3, "layer": 1.0}[block]
    flops = {"attn": c.attn_flops, "mlp": c.mlp_flops, "layer": c.attn_flops + c.mlp_flops}[block]
    return flops, share * c.layer_params * db, c.boundary_bytes


def stage_params(w: Workload, plan: Plan, costs: BlockCosts, stage: int, layers_per_stage: int) -> float:
    params = layers_per_stage * costs.layer_params
    if stage == 0:
        params += costs.embed_params
    if stage == plan.num_stages - 1:
        params += costs.head_params
    return params


def largest_param(w: Workload, plan: Plan, stages: list[int]) -> float:
    """Elements of the largest parameter tensor a rank holds for ``stages``: an MLP weight (4d x d), or the token
    embedding or output projection (vocab x d) on the first and last stages. Sharded by tp, and by dp under FSDP."""
    d = w.hidden
    sizes = [4 * d * d / plan.tp]
    if 0 in stages or plan.num_stages - 1 in stages:
        sizes.append(w.vocab * d / plan.tp)
    return max(sizes) / (plan.dp if plan.fsdp_enabled else 1)


def state_bytes(w: Workload, plan: Plan, params: float) -> dict[str, float]:
    """Resident parameter, gradient, optimizer and gradient-bucket bytes on one rank for ``params`` parameters.

    DDP (sharding none and zero1 with dp > 1) flattens gradients into its reducer's buckets, allocated when it
    wraps the model: one more copy of the gradients for the whole run (measured on gloo ranks: 13.7 MB of
    buckets for 13.7 MB of fp32 parameters).
    """
    db = dtype_bytes(w)
    fsdp = plan.fsdp_enabled
    shard = plan.dp if fsdp else 1
    opt_shard = plan.dp if plan.sharding != "none" else 1
    ddp = plan.dp > 1 and not fsdp
    return {
        "param": params * db / shard,
        "grad": params * db / shard,
        "optimizer": params * ADAM_STATE_BYTES / opt_shard,
        "ddp_buckets": params * db if ddp else 0.0,
    }


def saved_bytes_per_layer(c: BlockCosts, plan: Plan) -> float:
    """Activation bytes one layer keeps for backward: all of them, the matmul outputs
    (selective: the block input plus 4 hidden-sized tensors per tp shard), or the block input (full)."""
    if plan.recompute == "none":
        return c.activation_bytes_per_layer
    return c.boundary_bytes * (1 + 4 / plan.tp) if plan.recompute == "selective" else c.boundary_bytes


def in_flight_microbatches(plan: Plan, stage: int = 0) -> float:
    """Micro-batches whose activations a stage holds at its peak (first stage: the worst).

    GPipe keeps all of them; 1F1B at most pp - stage; interleaved 1F1B
    Megatron's warm-up count (pp - stage - 1) * 2 + (v - 1) * pp + 1, spread over
    v chunks, so in layer-equivalents of the stage's share of the model.
    """
    n = plan.num_microbatches
    if plan.pp == 1 or plan.pp_schedule == "gpipe":
        return float(n) if plan.pp > 1 else 1.0
    if plan.pp_schedule == "1f1b":
        return float(min(n, plan.pp - stage))
    v = plan.virtual_stages
    return min(n * v, (plan.pp - stage - 1) * 2 + (v - 1) * plan.pp + 1) / v


def analytic_peak_bytes(w: Workload, plan: Plan) -> float:
    """Closed-form peak of the first pipeline rank (the one holding most activations)."""
    c = block_costs(w, plan)
    layers = w.layers // plan.pp
    params = layers * c.layer_params + c.embed_params + (c.head_params if plan.pp == 1 else 0.0)
    state = sum(state_bytes(w, plan, params).values())
    activations = in_flight_microbatches(plan) * layers * saved_bytes_per_layer(c, plan)
    logits = 3 * c.logits_bytes if plan.pp == 1 else 0.0  # logits, their softmax and its gradient
    return state + activations + logits
