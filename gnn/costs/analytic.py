"""Analytic per-block costs of a model of collect.workloads under a plan (per family: gnn.costs.layers).

Formulas from the transformer characterisation (Cheng et al., "Thorough Characterization and Analysis of Large
Transformer Model Training At-Scale"): per
layer 12d^2 parameters; forward matmul FLOPs 24 b s d^2 + 4 b s^2 d per layer
(the b(72sd^2 + 12s^2d) per training step, over three passes). Activation bytes are the tensors the collector's
blocks save for backward (gnn.costs.layers, checked against fake-tensor traces of its code at full size), attention
fused: no s^2 scores (the collector's scaled_dot_product_attention runs the flash kernel on CPU, flash or
memory-efficient ones on GPUs, as Megatron's and torchtitan's attention does); Korthikanti et al.'s 34 s b h for
GPT counts dropout's masks and inputs, which the collector's GPT has none of (it kept 16 s b h at tp 1, where 34
was charged). Tensor parallelism divides the matmul FLOPs and most activation
bytes by tp (not the logits: the head's output is gathered); full recompute
keeps only each block's input. Context parallelism splits every per-token figure by cp (a rank holds s / cp
of each sample's tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from collect.schema import DTYPE_BYTES, Plan, Workload
from gnn.costs.gpu import QUANTISED_BYTES
from gnn.costs.layers import layer_matrices, layer_shape, local_expert_params

FP32_BYTES = 4  # an fp32 master weight or gradient


@dataclass(frozen=True)
class BlockCosts:
    """Per micro-batch, per tensor-parallel rank."""

    attn_flops: float
    mlp_flops: float
    head_flops: float
    activation_bytes_per_layer: float  # stored for backward, without recompute
    selective_bytes_per_layer: float  # stored under selective recompute
    residual_bytes: float  # the hidden state between blocks as a rank holds it (its sequence shard under sequence
    # parallelism): what full recompute keeps of each block, what a pipeline stage sends and receives
    boundary_bytes: float  # one whole hidden-state tensor b*s*d (the embedding's output, a TP collective's message)
    logits_bytes: float
    layer_params: float  # parameters of one layer on this tp rank
    expert_params: float  # of those, the routed experts' on this ep rank
    embed_params: float
    head_params: float
    attn_share: float = 1 / 3  # attention's share of a layer's weights
    attn_gemm_share: float = 1.0  # the projections' share of the attention's FLOPs (what FP8 speeds up)
    a2a_bytes: float = 0.0  # expert parallelism's all-to-all, one direction, one MoE layer-equivalent
    ring_bytes: float = 0.0  # context parallelism: the key/value shard one ring step passes on
    mlp_grad_bytes: float = 0.0  # held at once by one layer's MLP backward beyond what it keeps (layers.mlp_grad_bytes)
    moe_extra_params: float = 0.0  # a MoE layer's weights over a dense one's on this rank (LayerShape)


def dtype_bytes(w: Workload) -> int:
    return DTYPE_BYTES.get(w.dtype or "bfloat16", 2)


def block_costs(w: Workload, plan: Plan) -> BlockCosts:
    b, s, d, v = w.micro_batch_size, w.seq_len, w.hidden, w.vocab
    t, db = plan.tp, dtype_bytes(w)
    tokens = b * s / plan.cp
    shape = layer_shape(w, plan)
    act = tokens * shape.act_bytes * db / 2
    if plan.attention == "eager":  # the softmax's output, which both matmuls' backward read: s scores per query
        act += tokens * s * w.heads / t * db  # and head (Korthikanti et al. 2022's 2as^2b, attention dropout aside)
    tied_alone = w.tied_embeddings and plan.num_stages == 1  # one matrix serves both ends
    return BlockCosts(
        attn_flops=tokens * shape.attn_flops,
        mlp_flops=tokens * shape.mlp_flops,
        head_flops=2 * tokens * d * v / t,
        activation_bytes_per_layer=act,
        selective_bytes_per_layer=tokens * shape.selective_bytes * db / 2,
        residual_bytes=tokens * d * db / (t if plan.sequence_parallel else 1),
        boundary_bytes=tokens * d * db,
        # cross-entropy runs in fp32 on the vocabulary: the collector's TP head is ColwiseParallel with a
        # replicated output (collect/parallel/tp.py), so every rank holds all the logits, unless the plan keeps
        # them sharded (loss_parallel, as Megatron's vocab-parallel cross entropy does)
        logits_bytes=tokens * v * 4 / (t if plan.loss_parallel else 1),
        layer_params=shape.params,
        expert_params=shape.expert_params,
        embed_params=(v * d) / t + w.position_params,
        head_params=(0 if tied_alone else (v * d) / t) + w.final_norm_params,
        attn_share=shape.attn_share,
        attn_gemm_share=shape.attn_gemm_share,
        a2a_bytes=tokens * shape.a2a_elements * db,
        ring_bytes=tokens * shape.ring_elements * db if plan.cp_enabled else 0.0,
        mlp_grad_bytes=max(tokens * shape.mlp_grad_bytes * db / 2, expert_grad_stack_bytes(w, plan)),
        moe_extra_params=shape.moe_extra_params,
    )


def expert_grad_stack_bytes(w: Workload, plan: Plan) -> float:
    """What a MoE layer's backward holds while it stacks its experts' weight gradients: the collector's experts
    take their weights by unbind (collect.workloads.moe), so each expert's three gradients wait for the last
    expert's, then each stacked weight's gradient is made beside them: 4/3 of the layer's local experts."""
    if not w.moe_layers:
        return 0.0
    return 4 / 3 * local_expert_params(w, plan) * grad_dtype_bytes(w, plan)


def block_features(c: BlockCosts, block: str, db: int) -> tuple[float, float, float]:
    """(FLOPs, weight bytes, activation bytes) of one block for one micro-batch on one tensor-parallel rank: what
    gnn.costs.blocks's measured costs are fitted to. Blocks: attn, mlp, layer (both), embed, head. A layer's weights
    are split by attention's share (GPT: a third, q, k, v, o: 4d^2 of 12d^2); activations are the hidden state a block
    reads (the head: its fp32 logits)."""
    if block == "embed":
        return 0.0, c.embed_params * db, c.boundary_bytes
    if block == "head":
        return c.head_flops, c.head_params * db, c.logits_bytes
    share = {"attn": c.attn_share, "mlp": 1 - c.attn_share, "layer": 1.0}[block]
    flops = {"attn": c.attn_flops, "mlp": c.mlp_flops, "layer": c.attn_flops + c.mlp_flops}[block]
    return flops, share * c.layer_params * db, c.boundary_bytes


def stage_moe_layers(w: Workload, stage_layers: tuple[int, ...], stage: int) -> int:
    """MoE layers among a stage's blocks (Plan.stage_layers' split, in order)."""
    start = sum(stage_layers[:stage])
    return w.moe_layers_in(start, start + stage_layers[stage])


def block_params(w: Workload, costs: BlockCosts, stage_layers: tuple[int, ...], stage: int) -> float:
    """Parameters of a stage's blocks: its dense and MoE layers as they fall, where a layer's figures are averages
    over the model's (DeepSeek-V3's first stage of 8 holds its 3 dense layers and 4 MoE ones, not 7 average)."""
    layers = stage_layers[stage]
    if not w.moe_layers:
        return layers * costs.layer_params
    surplus = stage_moe_layers(w, stage_layers, stage) - layers * w.moe_layers / w.layers
    return layers * costs.layer_params + surplus * costs.moe_extra_params


def stage_params(w: Workload, plan: Plan, costs: BlockCosts, stage_layers: tuple[int, ...], stage: int) -> float:
    """Parameters of a pipeline stage: its blocks (and the embedding or head at the ends)."""
    params = block_params(w, costs, stage_layers, stage)
    if stage == 0:
        params += costs.embed_params
    if stage == plan.num_stages - 1:
        params += costs.head_params
    return params


def largest_param(w: Workload, plan: Plan, stages: list[int]) -> float:
    """Elements of the largest parameter tensor a rank holds for ``stages``: an MLP weight (ffn x d), a MoE layer's
    experts (one grouped tensor, split over ep), or the token embedding or output projection (vocab x d) on the
    first and last stages. Sharded by tp, and by dp under FSDP."""
    d = w.hidden
    sizes = [max(w.dense_ffn, w.heads * w.head_size) * d / plan.tp]
    if w.moe_layers:
        sizes.append(w.experts / plan.ep * w.expert_ffn_hidden * d / plan.expert_tp)
    if 0 in stages or plan.num_stages - 1 in stages:
        sizes.append(w.vocab * d / plan.tp)
    return max(sizes) / (plan.data_ranks if plan.fsdp_enabled else 1)


def grad_dtype_bytes(w: Workload, plan: Plan) -> int:
    """Bytes of one gradient element, as kept and reduced: fp32 under plan.fp32_grads, else the weights' dtype."""
    return FP32_BYTES if plan.fp32_grads else dtype_bytes(w)


def state_bytes(w: Workload, plan: Plan, params: float, expert_params: float = 0.0) -> dict[str, float]:
    """Resident parameter, gradient, optimizer and gradient-bucket bytes on one rank for ``params`` parameters.

    DDP (sharding none and zero1 with dp > 1) flattens gradients into its reducer's buckets, allocated when it
    wraps the model: one more copy of the gradients for the whole run (measured on gloo ranks: 13.7 MB of
    buckets for 13.7 MB of fp32 parameters); Nanotron wraps its bf16 model in torch's DDP too. fp32 master weights
    are optimizer state (sharded with it); fp32 gradients replace the weights' own (Megatron's main_grad,
    Nanotron's accumulator, which frees each bf16 .grad once added), whole under zero1 (both keep every gradient
    to accumulate micro-batches before the reduce-scatter). Under FSDP with fp32 master weights the fp32 shard is
    the parameter and the 2-byte copy exists only gathered (FSDP2's mixed precision), so no 2-byte shard is kept;
    with plan.float8_params the quantised weights are the parameters, and no 2-byte copy is kept either.
    ``expert_params``: of ``params``, the routed experts' (held by this ep rank), which FSDP shards its own way
    (fsdp_expert_share).
    """
    db = dtype_bytes(w)
    fsdp = plan.fsdp_enabled
    held = held_params(w, plan, params, expert_params)
    opt_held = stepped_params(w, plan, params, expert_params)
    ddp = plan.data_ranks > 1 and not fsdp
    master = FP32_BYTES if plan.fp32_master_weights else 0
    moments = 2 * moment_bytes(w, plan)
    state = {
        "param": 0.0 if (fsdp and master) or plan.float8_params else held * db,
        "grad": held * grad_dtype_bytes(w, plan),
        "optimizer": opt_held * (moments + master),
        "ddp_buckets": params * db if ddp else 0.0,
    }
    if w.float8 != "none":  # low-precision GEMMs keep their weights quantised too, row- and column-wise
        state["quantised_weights"] = held * 2 * QUANTISED_BYTES[w.float8]  # (Transformer Engine's cache)
    return state


def held_params(w: Workload, plan: Plan, params: float, expert_params: float = 0.0) -> float:
    """Of ``params`` (``expert_params`` of them routed experts), those a rank holds after FSDP's sharding."""
    if not plan.fsdp_enabled or not expert_params:
        return params / (plan.data_ranks if plan.fsdp_enabled else 1)
    return (params - expert_params) / plan.data_ranks + expert_params * fsdp_expert_share(w, plan)


def stepped_params(w: Workload, plan: Plan, params: float, expert_params: float = 0.0) -> float:
    """Of ``params``, those a rank's optimizer steps: its FSDP shard, its ZeRO-1 share, or all of them."""
    if plan.fsdp_enabled:
        return held_params(w, plan, params, expert_params)
    return params / (plan.data_ranks if plan.sharding != "none" else 1)


def fsdp_expert_share(w: Workload, plan: Plan) -> float:
    """The share of its ep rank's routed experts an FSDP rank holds. With expert parallelism they are sharded over
    the data ranks that hold the same experts (dp / ep; torchtitan's dp_mod_ep), along their second dimension
    where those ranks outnumber the experts; without it, with the rest of the block, each rank holding whole
    experts, padded to as many as the first rank holds (FSDP2's dim-0 chunks: DeepSeek-V3's 256 experts over 4,096
    ranks leave each rank one expert's room, 16 times its share)."""
    local = w.experts // plan.ep
    if plan.ep > 1:
        group = max(plan.data_ranks // plan.ep, 1)
        return 1 / group if local < group else math.ceil(local / group) / local
    return math.ceil(local / plan.data_ranks) / local


def moment_bytes(w: Workload, plan: Plan) -> int:
    """Bytes of one of AdamW's two moments per parameter: as the plan says, else as torch's AdamW keeps them, in
    its parameters' dtype (the fp32 master weights' where the plan keeps them, the weights' own where it does not:
    pure bf16 training keeps bf16 moments)."""
    if plan.optimizer_state_dtype is not None:
        return 2 if plan.optimizer_state_dtype == "bfloat16" else FP32_BYTES
    return FP32_BYTES if plan.fp32_master_weights else dtype_bytes(w)


def gathered_expert_room(w: Workload, plan: Plan) -> float:
    """FSDP's all-gather of an ep rank's routed experts over their shard group, as a multiple of their bytes: every
    rank's shard padded to the first's (1 where the shards are even)."""
    group = plan.data_ranks // plan.ep if plan.ep > 1 else plan.data_ranks
    return fsdp_expert_share(w, plan) * max(group, 1)


def gathered_layer_room(w: Workload, plan: Plan) -> float:
    """FSDP2's all-gather of a layer's weights (routed experts aside) as a multiple of their bytes. A weight of r
    rows over n ranks is gathered as n x ceil(r / n) rows, and the unsharded weight is a view of that buffer
    (torch.distributed.fsdp._fully_shard._fsdp_param.init_unsharded_param), holding the padding as long as it is
    gathered: 1 where every r divides by n; 4 for a 4,096-row weight over 16,384 ranks, 2,048 for an 8-expert
    router."""
    n = plan.data_ranks
    if not plan.fsdp_enabled or n == 1:
        return 1.0
    matrices = layer_matrices(w, plan)
    return sum(n * math.ceil(r / n) * c for r, c in matrices) / sum(r * c for r, c in matrices)


def saved_bytes_per_layer(c: BlockCosts, plan: Plan) -> float:
    """Activation bytes one layer keeps for backward: all of them, the block's input and the matmuls' and
    attention's outputs (selective: gnn.costs.layers), or the block's input (full), each rank its sequence shard of
    it under sequence parallelism (torchtitan's and Megatron's TP plans alike)."""
    if plan.recompute == "none":
        return c.activation_bytes_per_layer
    return c.selective_bytes_per_layer if plan.recompute == "selective" else c.residual_bytes


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
    layers = sum(plan.stage_layers(w.layers, w.pipeline_costs)[:: plan.pp])  # the first pipeline rank's stages
    params = layers * c.layer_params + c.embed_params + (c.head_params if plan.pp == 1 else 0.0)
    state = sum(state_bytes(w, plan, params, layers * c.expert_params).values())
    activations = in_flight_microbatches(plan) * layers * saved_bytes_per_layer(c, plan)
    logits = 3 * c.logits_bytes if plan.pp == 1 else 0.0  # logits, their softmax and its gradient
    return state + activations + logits


def steps_one_by_one(w: Workload, plan: Plan) -> bool:
    """Whether AdamW steps the parameters one at a time on CUDA too, not with its foreach kernels (CUDA's default):
    where tensor parallelism without FSDP leaves some of them plain tensors beside its DTensors, which the foreach
    kernels refuse (collect.parallel.dp.build_optimizer). collect.parallel.tp leaves a gpt's learned positions
    plain, and any model's norms without sequence parallelism; FSDP makes every parameter a DTensor."""
    return plan.tp_enabled and not plan.fsdp_enabled and (w.family == "gpt" or not plan.sequence_parallel)
