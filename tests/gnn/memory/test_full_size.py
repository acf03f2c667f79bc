"""The simulator's memory at full size, term by term, by hand: what a checkpoint keeps under sequence parallelism,
what selective recompute keeps, how FSDP shards routed experts with and without expert parallelism, and AdamW's
moments in its parameters' dtype. Each figure is what the fake traces of the collector's own code read
(collect.fake; experiments/results/simulator_vs_fake.json)."""

import pytest

from collect.schema import Plan, Workload
from gnn.costs.analytic import (
    block_costs,
    fsdp_expert_share,
    gathered_expert_room,
    gathered_layer_room,
    saved_bytes_per_layer,
    state_bytes,
)

LLAMA_70B = dict(family="llama", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256)
LLAMA_8B = dict(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
MIXTRAL = dict(family="moe", layers=32, hidden=4096, heads=32, kv_heads=8, vocab=32000, experts=8, top_k=2,
               expert_ffn_hidden=14336)  # fmt: skip
DEEPSEEK_V3_MOE = dict(MIXTRAL, experts=256, top_k=8, expert_ffn_hidden=2048, hidden=7168, heads=128)


def _workload(shape: dict, seq_len: int = 8192, mbs: int = 1) -> Workload:
    return Workload(**shape, seq_len=seq_len, micro_batch_size=mbs, global_batch_size=mbs, dtype="bfloat16")


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_full_recompute_keeps_the_block_input_each_rank_its_sequence_shard(tp):
    w = _workload(LLAMA_70B)
    whole = 8192 * 8192 * 2  # one block's input, bf16: 128 MiB
    for sp, kept in ((False, whole), (True, whole / tp)):
        plan = Plan(tp=tp, sequence_parallel=sp and tp > 1, recompute="full")
        assert saved_bytes_per_layer(block_costs(w, plan), plan) == (kept if tp > 1 else whole)


def test_selective_recompute_keeps_the_input_and_every_matmul_and_attention_output_by_hand():
    """Llama 3.1 8B at tp 2 with sequence parallelism, per token: the input's shard d/2, q, k, v and the core's
    output split (4096 + 1024 + 1024 + 4096) / 2, the output projection's and w2's outputs whole (partial sums
    before the reduce-scatter) 2d, w1's and w3's split 2 x 14336 / 2; bf16. The fake trace reads 466.5 MiB a layer
    at sequence 8,192, of which 2 MiB are the rotary tables' bf16 copies."""
    w, plan = _workload(LLAMA_8B), Plan(tp=2, sequence_parallel=True, recompute="selective")
    per_token = 4096 / 2 + (4096 + 1024 + 1024 + 4096) / 2 + 2 * 4096 + 2 * 14336 / 2
    assert saved_bytes_per_layer(block_costs(w, plan), plan) == 8192 * per_token * 2 == 464 * 2**20


def test_no_recompute_keeps_k_and_v_repeated_to_every_query_head_and_the_output_twice():
    """The fused core's inputs after repeat_kv, its output and the output projection's contiguous copy: at tp 1
    1472 MiB a layer of Llama 3.1 8B at sequence 8,192 (the fake trace: 1475, the rotary tables' copies aside)."""
    w, plan = _workload(LLAMA_8B), Plan()
    assert block_costs(w, plan).activation_bytes_per_layer == 1472 * 2**20


def test_latent_attention_keeps_its_whole_key_value_up_projection_which_the_values_are_a_view_of():
    """DeepSeek-V3's attention in a dense llama, tp 1, no recompute, per token: the norms 8d, q and k (128 heads x
    192) and the output twice (128 x 128), the values' whole up-projection with the unrotated keys (128 x 256: v is
    split from it, and the core saves v), the latents before and after their norms (1536 + 512 + 64) and SwiGLU's
    8 ffn bytes. Without the keys' half of that up-projection the simulator was 4-5% under every DeepSeek-V3 trace
    without recompute (0.1-0.5% with it)."""
    mla = dict(q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)
    shape = dict(family="llama", layers=4, hidden=7168, heads=128, ffn_hidden=18432, vocab=129280, **mla)
    per_token = 8 * 7168 + 2 * (2 * 128 * 192 + 2 * 128 * 128 + 128 * 256) + 4 * (1536 + 512 + 64) + 8 * 18432
    assert block_costs(_workload(shape, 4096), Plan()).activation_bytes_per_layer == 4096 * per_token


def test_experts_under_fsdp_with_expert_parallelism_are_divided_once():
    """Mixtral 8x7B, ep 8 under FSDP on 16 ranks: the experts of an ep rank are sharded over the 2 data ranks that
    hold the same ones, so every rank holds a 16th of all of them (the issue's 0.8 GiB of weights were a 128th)."""
    w = _workload(MIXTRAL, seq_len=4096)
    plan = Plan(dp=16, ep=8, sharding="fsdp_full", recompute="full")
    c = block_costs(w, plan)
    assert c.expert_params == 8 / 8 * 3 * 4096 * 14336
    state = state_bytes(w, plan, w.layers * c.layer_params, w.layers * c.expert_params)
    per_rank = w.layers * (8 * 3 * 4096 * 14336 / 16 + (c.layer_params - c.expert_params) / 16)
    assert state["param"] == pytest.approx(per_rank * 2)


def test_without_expert_parallelism_fsdp_pads_each_rank_to_whole_experts():
    """Routed experts sharded with the rest of a block along their first dimension: over more ranks than experts
    each rank holds room for one whole expert (torch.chunk's padding), not its even share."""
    w = _workload(DEEPSEEK_V3_MOE, seq_len=4096)
    assert fsdp_expert_share(w, Plan(dp=4096, sharding="fsdp_full")) == 1 / 256
    assert fsdp_expert_share(w, Plan(dp=64, sharding="fsdp_full")) == 4 / 256
    assert fsdp_expert_share(w, Plan(dp=4096, ep=32, sharding="fsdp_full")) == 1 / 128  # along the second dimension


def test_fsdp_gathers_padded_experts_with_every_ranks_padding():
    """Qwen3-235B's 128 experts over 16,384 ranks without ep: each rank's shard is padded to a whole expert, and an
    all-gather collects all 16,384 shards: 128 times the experts' bytes (the fake trace: 55,407 GiB a rank under
    fsdp_grad_op, the simulator 54,828). With ep they are sharded evenly along their second dimension."""
    w = _workload(dict(DEEPSEEK_V3_MOE, experts=128), seq_len=4096)
    assert gathered_expert_room(w, Plan(dp=16384, sharding="fsdp_grad_op")) == 128
    assert gathered_expert_room(w, Plan(dp=128, sharding="fsdp_full")) == 1
    assert gathered_expert_room(w, Plan(dp=16384, ep=32, sharding="fsdp_full")) == 1


def test_fsdp_gathers_every_weight_with_fewer_rows_than_ranks_padded_to_a_row_a_rank():
    """FSDP2's unsharded weight is a view of its padded all-gather buffer: over 16,384 ranks Llama 3.1 8B's q and o
    (4,096 rows), k and v (1,024), w2 (4,096) and the norms are gathered as 16,384 rows, w1 and w3 (14,336) too.
    Mixtral's grad_op plan on 16,384 ranks traces at 52.7 GiB, 36.3 simulated without this, 54.4 with it."""
    w, d, ffn, n = _workload(LLAMA_8B), 4096, 14336, 16384
    real = 2 * d * d + 2 * 1024 * d + 3 * d * ffn + 2 * d
    # q, k, v, o, w1 and w3 gathered as n rows of d columns, w2 as n rows of ffn, the two norms as n elements
    assert gathered_layer_room(w, Plan(dp=n, sharding="fsdp_grad_op")) == pytest.approx(
        (6 * n * d + n * ffn + 2 * n) / real
    )
    assert gathered_layer_room(w, Plan(dp=64, sharding="fsdp_full")) == 1.0  # every row count divides by 64
    assert gathered_layer_room(w, Plan(dp=n, sharding="zero1")) == 1.0  # nothing gathered


def test_adamw_keeps_its_moments_in_the_dtype_of_what_it_steps():
    w, n = _workload(LLAMA_8B), 1000.0
    assert state_bytes(w, Plan(), n)["optimizer"] == 2 * 2 * n  # pure bf16: bf16 moments
    assert state_bytes(w, Plan(fp32_master_weights=True, fp32_grads=True), n)["optimizer"] == (4 + 8) * n
    assert state_bytes(w, Plan(optimizer_state_dtype="float32"), n)["optimizer"] == 8 * n


@pytest.mark.parametrize("tp, sp, mib", [(1, False, 768), (8, False, 264), (8, True, 180)])
def test_gpt_keeps_its_norms_attention_and_mlp_outputs_not_korthikantis_dropout(tp, sp, mib):
    """A GPT-3 175B layer at sequence 2,048 without recompute: the norms' inputs and outputs, q, k, v and the
    core's output, fc1's and GELU's outputs; the fake traces read 768.8, 264.0 and 180.0 MiB (Korthikanti's 34 s b h,
    which counts dropout the collector's GPT does not have, charged 816 at tp 1)."""
    w = Workload(family="gpt", layers=96, hidden=12288, heads=96, vocab=50304, seq_len=2048, micro_batch_size=1,
                 global_batch_size=1, dtype="bfloat16")  # fmt: skip
    plan = Plan(tp=tp, sequence_parallel=sp)
    assert block_costs(w, plan).activation_bytes_per_layer == mib * 2**20
