"""The llama and moe families, expert and context parallelism and FP8 through the execution graph: each shows up
as the work and bytes it costs, checked by hand on small cases."""

import math

import pytest

from collect.schema import Cluster, Plan, RunSpec, Workload
from gnn.costs.analytic import block_costs
from gnn.costs.hardware import hardware_model
from gnn.costs.pricing import Pricing
from gnn.graph.build import build_graph
from gnn.sim.simulate import simulate
from tests.gnn.test_graph import UnitHardware, kinds

LLAMA = dict(family="llama", layers=4, hidden=64, heads=8, kv_heads=2, ffn_hidden=96, vocab=128, seq_len=32)
MOE = dict(LLAMA, family="moe", experts=8, top_k=2, expert_ffn_hidden=48)
del MOE["ffn_hidden"]


def _spec(workload: dict, **plan) -> RunSpec:
    p = Plan(**plan)
    w = Workload(**workload, micro_batch_size=2, global_batch_size=2 * p.dp * p.num_microbatches)
    cluster = Cluster(devices_per_node=p.world_size, memory_bytes=2**34, device="cuda", backend="nccl")
    return RunSpec(workload=w, plan=p, cluster=cluster)


def _graph(workload: dict, **plan):
    spec = _spec(workload, **plan)
    return build_graph(spec.workload, spec.plan, spec.cluster, UnitHardware()), spec


def test_grouped_query_attention_and_swiglu_flops_by_hand():
    c = block_costs(Workload(**LLAMA, micro_batch_size=2, global_batch_size=2), Plan())
    tokens, d, kv = 2 * 32, 64, 2 * 8  # kv_heads x head_dim
    assert c.attn_flops == tokens * (2 * (2 * d * d + 2 * d * kv) + 4 * 32 * d)
    assert c.mlp_flops == tokens * 2 * 3 * d * 96
    mha = block_costs(Workload(**{**LLAMA, "kv_heads": 8}, micro_batch_size=2, global_batch_size=2), Plan())
    assert c.attn_flops < mha.attn_flops and c.activation_bytes_per_layer < mha.activation_bytes_per_layer


def test_a_llama_plan_simulates_to_finite_time_and_memory():
    g, _ = _graph(LLAMA, dp=2, tp=2, pp=2, num_microbatches=2, sharding="fsdp_full", recompute="full")
    sim = simulate(g)
    assert math.isfinite(sim.iter_time_s) and sim.iter_time_s > 0 and sim.peak_mem_bytes > 0


def test_expert_parallel_all_to_all_moves_top_k_copies_of_each_token():
    g, spec = _graph(MOE, dp=4, ep=4, sharding="fsdp_full")
    forward = [n for n in g.nodes if n.kind == "ep_a2a" and n.phase == "forward"]
    assert len(forward) == 2 and all(n.count == 4 and n.group == 4 for n in forward)  # dispatch, combine
    tokens, d, fp32 = 2 * 32, 64, 4
    assert forward[0].message_bytes == tokens * 2 * d * fp32 * 3 / 4  # top_k copies, 3/4 leave the rank
    assert kinds(g, "backward")["ep_a2a"] == 2
    # the routed experts are split over the ep ranks: a quarter of them each
    assert block_costs(spec.workload, spec.plan).layer_params < block_costs(spec.workload, Plan(dp=4)).layer_params


def test_an_uneven_router_slows_the_busiest_expert_rank():
    even = block_costs(Workload(**MOE, micro_batch_size=2, global_batch_size=8), Plan(dp=4, ep=4))
    skewed = Workload(**MOE, expert_imbalance=1.5, micro_batch_size=2, global_batch_size=8)
    uneven = block_costs(skewed, Plan(dp=4, ep=4))
    router = 2 * 32 * 2 * 64 * 8
    assert uneven.mlp_flops - router == pytest.approx(1.5 * (even.mlp_flops - router))


def test_context_parallel_ring_passes_kv_shards_cp_minus_one_times_per_layer():
    g, spec = _graph(LLAMA, cp=4)
    (ring,) = [n for n in g.nodes if n.kind == "cp_ring" and n.phase == "forward"]
    local_tokens = 2 * 32 // 4
    assert ring.count == 4 * 3 and ring.message_bytes == 2 * local_tokens * 16 * 4  # k and v, fp32
    (back,) = [n for n in g.nodes if n.kind == "cp_ring" and n.phase == "backward"]
    assert back.message_bytes == 2 * ring.message_bytes
    whole = block_costs(spec.workload, Plan())
    assert block_costs(spec.workload, spec.plan).attn_flops == pytest.approx(whole.attn_flops / 4)


def test_float8_runs_the_linears_at_the_fp8_peak():
    hw = hardware_model("h100-80gb")
    w = Workload(**LLAMA, dtype="bfloat16", micro_batch_size=2, global_batch_size=2)
    fp8 = w.model_copy(update={"float8": "rowwise"})
    bf16_mlp, fp8_mlp = (
        Pricing(x, Plan(), block_costs(x, Plan()), hw, (4,), False)._compute_seconds("mlp", 1e12) for x in (w, fp8)
    )
    peaks = hw.flops_per_s
    assert fp8_mlp / bf16_mlp == pytest.approx(peaks["bfloat16"] / peaks["float8"])


@pytest.mark.parametrize(
    "workload, plan",
    [
        (dict(LLAMA, tied_embeddings=True), dict(dp=2, sharding="fsdp_full")),
        (dict(MOE, shared_experts=1, expert_imbalance=1.5), dict(dp=4, ep=2, sharding="fsdp_grad_op")),
    ],
)
def test_a_collected_row_of_each_family_reads_back_as_its_spec(workload, plan):
    """A row as the collector stores it, in a frame with GPT rows (whose family columns are then gaps)."""
    import pandas as pd

    from collect.launch.result import RunResult, build_row
    from collect.schema.workload import LATER_FIELDS
    from gnn.dataset.rows import row_to_spec

    spec = _spec(workload, **plan)
    gpt = _spec(dict(layers=2, hidden=64, heads=4, vocab=128, seq_len=32), dp=2)
    result = RunResult(status="ok", iter_times_s=[0.1], peak_mem_bytes_per_rank=[1], rss_hwm_bytes_per_rank=[None])
    later = {*LATER_FIELDS, "cp", "ep", "float8_all_gather"}
    old = {k: v for k, v in build_row(gpt, result).items() if k not in later}  # collected before they existed
    rows = pd.DataFrame([old, build_row(spec, result)])
    back = [row_to_spec(row)[0] for _, row in rows.iterrows()]
    assert back[1].workload == spec.workload and back[1].plan == spec.plan
    assert back[0].workload == gpt.workload and back[0].plan == gpt.plan
