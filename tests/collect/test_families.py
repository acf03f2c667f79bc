"""The llama and moe families in the schema: exact parameter counts, validation that shows its arithmetic,
run ids that stay what they were for the GPT rows collected before the families existed. And the collector's
multi-head latent attention (collect.workloads.llama.LatentAttention): as many parameters as the schema counts,
with and without a query latent, and the output of DeepSeek-V3's attention written out head by head (each head's
query and key: its own part without positions and a rotated part, the key's rotated part shared by every head;
softmax over 1/sqrt(nope + rope); values of their own width)."""

import json

import pytest
import torch
from pydantic import ValidationError

from collect import REPO
from collect.schema import Cluster, Plan, RunSpec, Workload, collect_problems
from collect.workloads.llama import LatentAttention, Llama, _rotate
from collect.workloads.moe import balanced_choice

BATCH = {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 8}
LLAMA3_8B = dict(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256)
MIXTRAL_8X7B = dict(
    family="moe", layers=32, hidden=4096, heads=32, kv_heads=8, experts=8, top_k=2, expert_ffn_hidden=14336, vocab=32000
)


def test_llama3_8b_parameter_count_by_hand():
    # per layer: q and o 4096^2 each, k and v 4096 x (8 x 128) each, SwiGLU 3 x 4096 x 14336, two RMSNorms 4096
    per_layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    by_hand = 32 * per_layer + 2 * 128256 * 4096 + 4096  # untied embedding and head, final norm
    w = Workload(**LLAMA3_8B, **BATCH)
    assert w.num_params == by_hand == 8_030_261_248
    assert w.active_params == w.num_params


def test_mixtral_8x7b_parameter_count_by_hand():
    per_layer = 2 * 4096**2 + 2 * 4096 * 1024 + 8 * 3 * 4096 * 14336 + 4096 * 8 + 2 * 4096  # router: 4096 x 8
    w = Workload(**MIXTRAL_8X7B, **BATCH)
    assert w.num_params == 32 * per_layer + 2 * 32000 * 4096 + 4096 == 46_702_792_704
    # two of eight experts per token: Mixtral's published 12.9B active parameters
    assert round(w.active_params / 1e9, 1) == 12.9


def test_experts_kept_on_an_expert_parallel_rank_keep_the_models_dtype():
    """An ep rank's experts are made anew (its share of them): in torch's default dtype they were fp32 in a bf16
    model, twice their memory (Mixtral 8x7B, ep 8 under FSDP: 234.9 MB per expert matrix where 117.4 MB is bf16)."""
    from collect.parallel.ep import moe_layers

    class EpMesh:  # apply_ep's mesh, as far as shard_experts reads it
        def size(self):
            return 8

        def get_group(self):
            return None

    with torch.device("meta"):
        model = Llama(Workload(**{**MIXTRAL_8X7B, "layers": 2}, **BATCH, dtype="bfloat16")).to(torch.bfloat16)
    for moe in moe_layers(model):
        moe.shard_experts(EpMesh())
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert moe.experts.w1.shape == (1, 4096, 14336)


def test_tied_embeddings_and_dense_leading_layers_change_the_count():
    tied = Workload(**{**LLAMA3_8B, "tied_embeddings": True}, **BATCH)
    assert Workload(**LLAMA3_8B, **BATCH).num_params - tied.num_params == 128256 * 4096
    mixed = Workload(**MIXTRAL_8X7B, ffn_hidden=14336, first_dense_layers=2, moe_every=2, **BATCH)
    assert mixed.moe_layers == 15  # layers 3, 5, ..., 31 of the 30 after the two dense ones


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({**LLAMA3_8B, "kv_heads": 5}, "workload.heads (32) must be divisible by workload.kv_heads (5): 32 % 5 = 2"),
        ({**LLAMA3_8B, "ffn_hidden": None}, "workload.ffn_hidden is required for family 'llama'"),
        ({**MIXTRAL_8X7B, "top_k": 9}, "workload.top_k (9) must be at most workload.experts (8)"),
        ({**MIXTRAL_8X7B, "experts": None}, "workload.experts is required for family 'moe'"),
        ({**MIXTRAL_8X7B, "moe_every": 2}, "ffn_hidden is required: 16 of the 32 layers have a dense MLP"),
        ({**LLAMA3_8B, "experts": 8}, "workload.experts is not a field of family 'llama'"),
        ({**LLAMA3_8B, "family": "gpt"}, "workload.kv_heads is not a field of family 'gpt'"),
        ({**LLAMA3_8B, "float8": "rowwise"}, "set dtype 'bfloat16'"),
        ({**LLAMA3_8B, "force_balanced_routing": True}, "workload.force_balanced_routing is not a field of family"),
        (
            {**MIXTRAL_8X7B, "force_balanced_routing": True, "expert_imbalance": 1.5},
            "workload.expert_imbalance (1.5) must be 1.0 with workload.force_balanced_routing",
        ),
    ],
)
def test_family_fields_are_checked_by_name(fields, expected):
    with pytest.raises(ValidationError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        Workload(**fields, **BATCH)


def test_forced_balanced_routing_deals_every_expert_the_same_slots():
    """Megatron's forced load balancing, as the collector runs it: a token's experts are distinct, and 7 tokens of
    top 2 over 4 experts give each 14 // 4 = 3 slots, the first 14 % 4 = 2 experts one more."""
    chosen = balanced_choice(7, 2, 4, torch.device("cpu"))
    assert chosen.shape == (7, 2) and (chosen[:, 0] != chosen[:, 1]).all()
    assert torch.bincount(chosen.flatten(), minlength=4).tolist() == [4, 4, 3, 3]


def _spec_problems(workload: dict, plan: dict, world: int, device: str = "cuda") -> str:
    cluster = Cluster(devices_per_node=world, memory_bytes=80 * 2**30, device=device, backend="gloo")
    with pytest.raises(ValidationError) as info:
        RunSpec(workload=Workload(**workload), plan=Plan(**plan), cluster=cluster)
    return str(info.value)


def test_plan_checks_show_the_arithmetic_for_tp_ep_and_cp():
    llama = {**LLAMA3_8B, **BATCH, "global_batch_size": 1}
    assert "workload.kv_heads (8) must be divisible by plan.tp (16): 8 % 16 = 8" in _spec_problems(
        llama, {"tp": 16}, 16
    )
    moe = {**MIXTRAL_8X7B, **BATCH, "global_batch_size": 2}
    assert "workload.experts (8) must be divisible by plan.ep (3)" in _spec_problems(moe, {"dp": 2, "ep": 3}, 2)
    said = "plan.ep (4) * plan.etp (1) = 4 must divide the ranks it borrows from, plan.dp (2) * plan.cp (1) * plan.tp"
    assert f"{said} (1) = 2: 2 % 4 = 2" in _spec_problems(moe, {"dp": 2, "ep": 4}, 2)
    assert "plan.ep (2) > 1 needs a mixture-of-experts workload" in _spec_problems(
        {**llama, "global_batch_size": 2}, {"dp": 2, "ep": 2}, 2
    )
    odd = {**llama, "seq_len": 4100}
    assert "workload.seq_len (4100) must be divisible by 2 * plan.cp (4) = 8: 4100 % 8 = 4" in _spec_problems(
        odd, {"cp": 4}, 4
    )
    fp8 = {**llama, "dtype": "bfloat16", "float8": "tensorwise"}
    assert "needs GPUs with FP8 matmuls" in _spec_problems(fp8, {}, 1, device="cpu")


def test_context_and_expert_parallel_ranks_count_in_the_world_size():
    moe = Workload(**MIXTRAL_8X7B, **{**BATCH, "global_batch_size": 2})
    plan = Plan(dp=2, cp=2, tp=2, ep=4, sharding="fsdp_grad_op")
    spec = RunSpec(workload=moe, plan=plan, cluster=Cluster(devices_per_node=8, memory_bytes=2**36, device="cuda"))
    assert spec.plan.world_size == 8  # ep borrows from dp x cp: no ranks of its own


def test_whole_experts_let_ep_span_the_tensor_parallel_ranks():
    """Megatron's expert grid (etp 1, as Megatron-Bridge's MoE recipes set it): ep may exceed dp x cp, up to
    dp x cp x tp; unset, etp is tp and ep stays inside dp x cp."""
    moe = Workload(**MIXTRAL_8X7B, **{**BATCH, "global_batch_size": 2})
    cluster = Cluster(devices_per_node=8, memory_bytes=2**36, device="cuda")
    whole = Plan(dp=2, tp=4, ep=8, etp=1, sharding="zero1", sequence_parallel=True)
    assert RunSpec(workload=moe, plan=whole, cluster=cluster).plan.expert_tp == 1
    assert "must divide the ranks it borrows from" in _spec_problems(
        {**MIXTRAL_8X7B, **BATCH, "global_batch_size": 2}, {"dp": 2, "tp": 4, "ep": 8}, 8
    )
    assert "plan.etp (1) other than plan.tp (4) is predicted only" in " ".join(collect_problems(moe, whole, cluster))


def test_float8_is_predicted_but_not_collected():
    w = Workload(**LLAMA3_8B, **BATCH, dtype="bfloat16", float8="rowwise")
    problems = collect_problems(w, Plan(dp=8), Cluster(devices_per_node=8, memory_bytes=2**36, device="cuda"))
    assert problems and "predicted only" in problems[0]


def test_gpt_run_ids_do_not_move_when_fields_are_added():
    spec = RunSpec.model_validate(
        {
            "workload": {
                "layers": 2,
                "hidden": 64,
                "heads": 2,
                "seq_len": 64,
                "vocab": 256,
                "micro_batch_size": 1,
                "global_batch_size": 2,
            },
            "plan": {"dp": 2},
            "cluster": {"devices_per_node": 2, "memory_bytes": 2**30},
        }
    )
    # the id this spec had before the llama and moe fields, cp and ep existed (main at 0e86758)
    assert spec.run_id == "85adf0741f1b8dc9"


def test_what_the_collector_cannot_measure_is_refused_with_the_reason():
    moe = Workload(**MIXTRAL_8X7B, **{**BATCH, "global_batch_size": 2})
    cluster = Cluster(devices_per_node=4, memory_bytes=2**36)
    problems = collect_problems(moe, Plan(dp=2, cp=2, ep=2, sharding="zero1", recompute="selective"), cluster)
    assert any(
        "plan.cp (2) is predicted only: torch's context_parallel cannot shard CPU attention" in p for p in problems
    )
    assert any("plan.ep (2) with plan.sharding 'zero1' is predicted only" in p for p in problems)
    assert any("plan.ep (2) with plan.recompute 'selective' is predicted only" in p for p in problems)
    assert collect_problems(moe, Plan(dp=4, ep=2, sharding="fsdp_full", recompute="full"), cluster) == []
    assert "family 'moe' is predicted only" in collect_problems(moe, Plan(tp=2, dp=2), cluster)[0]
    tied = Workload(**LLAMA3_8B, **BATCH, tied_embeddings=True)
    pipelined = Plan(pp=2, dp=4, num_microbatches=2)
    assert "tied_embeddings with plan.pp (2)" in collect_problems(tied, pipelined, cluster)[0]


# --- multi-head latent attention in the collector's model ---

MLA = dict(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12)
SHAPE = dict(layers=2, hidden=64, heads=4, seq_len=16, vocab=128, micro_batch_size=2, global_batch_size=2)
FAMILIES = {
    "llama": dict(family="llama", ffn_hidden=96),
    "moe": dict(family="moe", experts=4, top_k=2, expert_ffn_hidden=48, shared_experts=1),
    "moe_dense_first": dict(
        family="moe", experts=4, top_k=2, expert_ffn_hidden=48, first_dense_layers=1, ffn_hidden=96
    ),
}


def _workload(family: str, q_lora_rank: int | None) -> Workload:
    return Workload(**SHAPE, **FAMILIES[family], **MLA, q_lora_rank=q_lora_rank)


@pytest.mark.parametrize("q_lora_rank", [None, 24])
@pytest.mark.parametrize("family", FAMILIES)
def test_mla_parameter_count_matches_the_schema(family, q_lora_rank):
    w = _workload(family, q_lora_rank)
    with torch.device("meta"):
        model = Llama(w)
    assert all(isinstance(b.attention, LatentAttention) for b in model.layers.values())
    assert sum(p.numel() for p in model.parameters()) == w.num_params
    attention = model.layers["0"].attention
    assert sum(p.numel() for p in attention.parameters()) == w.attention.params


def _by_hand(a: LatentAttention, x: torch.Tensor, heads: int) -> torch.Tensor:
    """DeepSeek-V3's attention one head at a time, from the module's weights."""
    seq = x.shape[1]
    nope, rope_dim, v_dim = a.nope, a.rope_dim, a.v_dim
    q_all = a.wq_b(a.q_norm(a.wq_a(x))) if a.q_latent else a.wq(x)
    kv_a = a.wkv_a(x)
    kv_all = a.wkv_b(a.kv_norm(kv_a[..., : a.rank]))
    k_rope = _rotate(kv_a[..., a.rank :].unsqueeze(1), a.rope[:, :seq])[:, 0]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    outs = []
    for h in range(heads):
        q = q_all[..., h * (nope + rope_dim) : (h + 1) * (nope + rope_dim)]
        q_rope = _rotate(q[..., nope:].unsqueeze(1), a.rope[:, :seq])[:, 0]
        kv = kv_all[..., h * (nope + v_dim) : (h + 1) * (nope + v_dim)]
        qh, kh, vh = torch.cat([q[..., :nope], q_rope], -1), torch.cat([kv[..., :nope], k_rope], -1), kv[..., nope:]
        scores = (qh @ kh.transpose(-1, -2)) / (nope + rope_dim) ** 0.5
        outs.append(scores.masked_fill(~causal, float("-inf")).softmax(-1) @ vh)
    return a.wo(torch.cat(outs, -1))


@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_mla_is_deepseek_v3s_attention_head_by_head(q_lora_rank):
    w = _workload("llama", q_lora_rank)
    torch.manual_seed(0)
    model = Llama(w)
    model.init_weights()
    attention = model.layers["1"].attention
    for norm in (attention.kv_norm, getattr(attention, "q_norm", None)):
        if norm is not None:  # init_weights sets them to ones: make them count
            torch.nn.init.uniform_(norm.weight, 0.5, 1.5)
    x = torch.randn(2, w.seq_len, w.hidden)
    torch.testing.assert_close(attention(x), _by_hand(attention, x, w.heads))


def test_mla_model_trains_a_step():
    w = _workload("moe", 24)
    torch.manual_seed(0)
    model = Llama(w)
    model.init_weights()
    tokens = torch.randint(0, w.vocab, (2, w.seq_len))
    logits = model(tokens)
    assert logits.shape == (2, w.seq_len, w.vocab)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# --- public configs with latent attention and sliding windows (experiments/requests/hf) ------------------------


def _hf(name: str) -> Workload:
    config = json.loads((REPO / "experiments" / "requests" / "hf" / f"{name}.config.json").read_text())
    return Workload.from_hf_config(config, seq_len=4096, micro_batch_size=1, global_batch_size=64)


def test_deepseek_v3_reads_as_multi_head_latent_attention_over_its_published_layout():
    w = _hf("deepseek-v3")
    assert (w.q_lora_rank, w.kv_lora_rank, w.qk_nope_head_dim, w.qk_rope_head_dim, w.v_head_dim) == (
        1536,
        512,
        128,
        64,
        128,
    )
    assert (w.experts, w.top_k, w.shared_experts, w.first_dense_layers, w.moe_layers) == (256, 8, 1, 3, 58)
    # per layer: q down 7168 x 1536 and up 1536 x 128 x 192, kv down 7168 x 576, up 512 x 128 x 256, out 16384 x 7168
    a = w.attention
    assert a.params == 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    assert a.replicated_params == 7168 * (1536 + 576) + 1536 + 512  # the down-projections and their norms


def test_gpt_oss_windows_every_other_layer():
    w = _hf("gpt-oss-120b")
    assert (w.sliding_window, w.sliding_layers, w.experts, w.top_k, w.expert_ffn_hidden) == (128, 18, 128, 4, 2880)
    full = Workload.model_validate({**w.model_dump(), "sliding_window": None, "sliding_layers": 0})
    a, f = w.attention, full.attention
    assert a.core_flops(4096, 1, w.layers) == pytest.approx(f.core_flops(4096, 1, w.layers) * (1 + 128 / 4096) / 2)
