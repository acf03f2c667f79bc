"""The llama and moe families, expert and context parallelism and FP8 through the execution graph: each shows up
as the work and bytes it costs, checked by hand on small cases. And the runs of 2026: DeepSeek's latent attention
split as Megatron splits it, GPT-OSS's windows, block-scaled GEMMs on the GPUs that run them (and a clear refusal
elsewhere), experts that tensor parallelism does not split (etp), a hierarchical expert dispatch."""

import json
import math

import pytest

from collect import REPO
from collect.hardware.records import load_hardware
from collect.schema import Cluster, Plan, RunSpec, Workload, framework_conventions
from gnn.costs.analytic import block_costs
from gnn.costs.collectives import dispatch_remote_share
from gnn.costs.gpu import Rate, forward_seconds
from gnn.costs.hardware import HardwareModel, hardware_model
from gnn.costs.layers import layer_shape
from gnn.costs.pricing import Pricing
from gnn.graph.build import build_graph
from gnn.graph.table import KINDS
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
    assert c.attn_flops < mha.attn_flops
    # as many activations kept: k and v are repeated to every query head before the fused core (torchtitan's
    # repeat_kv, the collector's too), and the core keeps what it reads
    assert c.activation_bytes_per_layer == mha.activation_bytes_per_layer


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


# --- the runs of 2026 ------------------------------------------------------------------------------------------

HF = REPO / "experiments" / "requests" / "hf"
BATCH = {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 4096}


def _hf(name: str, **fields) -> Workload:
    return Workload.from_hf_config(json.loads((HF / f"{name}.config.json").read_text()), **BATCH, **fields)


def test_latent_attention_splits_its_up_projections_over_tp_and_keeps_its_down_projections_whole():
    w = _hf("deepseek-v3")
    a = w.attention
    for tp in (1, 2, 8):
        plan = Plan(dp=8 // tp, tp=tp, num_microbatches=4096 // (8 // tp), sequence_parallel=tp > 1)
        shape = layer_shape(w, plan)
        attn = shape.params * shape.attn_share
        assert attn == pytest.approx(a.replicated_params + a.split_params / tp)
        # q k^T over 192 channels a head and the values' 128, against all 4,096 keys
        core = 2 * 4096 * 128 * (192 + 128) / tp
        assert shape.attn_flops == pytest.approx(2 * attn + core)


def test_windowed_layers_attend_fewer_keys():
    w = _hf("gpt-oss-120b")
    full = w.model_copy(update={"sliding_window": None, "sliding_layers": 0})
    plan = Plan(dp=64, ep=64, num_microbatches=16)
    windowed, every = block_costs(w, plan).attn_flops, block_costs(full, plan).attn_flops
    assert windowed < every
    core = 2 * 4096 * (64 * 64 + 64 * 64)  # per token, every layer at full length
    assert every - windowed == pytest.approx(4096 * 0.5 * core * (1 - 128 / 4096))  # half the layers, 4,096 tokens


def _deepseek(float8: str, hardware: str = "gb200-nvl72", etp: int | None = 1) -> tuple[RunSpec, HardwareModel]:
    w = _hf("deepseek-v3", float8=float8)
    plan = {"dp": 64, "pp": 4, "ep": 64, "etp": etp, "virtual_stages": 4, "pp_schedule": "interleaved_1f1b"}
    plan |= {"num_microbatches": 64, "sharding": "zero1", **framework_conventions("megatron", 1, False, "bfloat16")}
    preset = load_hardware(hardware)
    cluster = {"nodes": 4, "devices_per_node": 64, "device": "cuda", "backend": "nccl", "device_kind": preset["id"]}
    cluster["memory_bytes"] = preset["memory_bytes"]
    return RunSpec.model_validate({"workload": w, "plan": plan, "cluster": cluster}), HardwareModel(preset)


def test_deepseek_v3_on_256_gb200s_in_mxfp8_is_priced_and_nvfp4_gemms_run_faster():
    times = {}
    for f in ("none", "mxfp8", "nvfp4"):
        spec, hw = _deepseek(f)
        times[f] = simulate(build_graph(spec.workload, spec.plan, spec.cluster, hw)).iter_time_s
    assert 0 < times["nvfp4"] < times["mxfp8"] < times["none"] < float("inf")
    spec, hw = _deepseek("mxfp8")
    rates = (Rate(1 / hw.compute_time(1.0, "mxfp8"), "mxfp8"), Rate(1 / hw.compute_time(1.0, "bfloat16"), "bfloat16"))
    quantised = forward_seconds(hw.kernels, spec.workload, spec.plan, "mlp", rates, 2)
    plain = forward_seconds(hw.kernels, spec.workload.model_copy(update={"float8": "none"}), spec.plan, "mlp", rates, 2)
    assert quantised > plain  # the same GEMM rate, plus quantising the inputs


def test_block_scaled_gemms_on_a_gpu_without_them_are_refused_by_field():
    spec, hw = _deepseek("mxfp8", hardware="h100-80gb")
    with pytest.raises(ValueError, match=r"workload.float8 'mxfp8' needs tensor cores that run it.*h100-80gb"):
        build_graph(spec.workload, spec.plan, spec.cluster, hw)


def test_whole_experts_spread_the_same_work_over_fewer_tokens_per_rank():
    """etp 1 with tp 2: each rank routes half the micro-batch through whole experts; etp 2: all of it through
    halves. The same FLOPs per rank; whole experts hold twice the weights and send half the all-to-all."""
    w = _hf("qwen3-235b-a22b")
    base = {"dp": 16, "tp": 2, "pp": 8, "num_microbatches": 256, "sequence_parallel": True}
    whole, split = layer_shape(w, Plan(**base, ep=16, etp=1)), layer_shape(w, Plan(**base, ep=16))
    assert whole.mlp_flops == pytest.approx(split.mlp_flops)
    assert whole.a2a_elements == pytest.approx(split.a2a_elements / 2)
    experts = 128 / 16 * 3 * 4096 * 1536
    assert whole.params - split.params == pytest.approx(experts / 2 * (w.moe_layers / w.layers))


def test_a_hierarchical_dispatch_sends_a_token_once_per_remote_node():
    """32 ranks on 4 nodes of 8, top 8: a remote node is hit with probability 1 - (3/4)^8 = 0.90, against 2
    copies sent to it one by one; inside one node nothing crosses the network."""
    assert dispatch_remote_share(32, 8, 8) == pytest.approx((1 - 0.75**8) / 2)
    assert dispatch_remote_share(64, 64, 8) == 1.0
    spec, hw = _deepseek("mxfp8", hardware="b200-180gb")
    spec = spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"nodes": 32, "devices_per_node": 8})})

    def a2a(dispatcher: str) -> float:
        plan = spec.plan.model_copy(update={"moe_dispatcher": dispatcher})
        g = build_graph(spec.workload, plan, spec.cluster, hw)
        kinds = g.column("kind")
        return float(g.column("est_time")[kinds == KINDS.index("ep_a2a")].sum())

    # ep 64 over 8 nodes: a remote node is hit with probability 1 - (7/8)^8 = 0.66 against one copy sent to it
    assert 0 < a2a("hybrid") < 0.75 * a2a("alltoall")
