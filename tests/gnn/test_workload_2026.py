"""The runs of 2026 in the cost model: DeepSeek's latent attention split as Megatron splits it, GPT-OSS's windows,
block-scaled GEMMs on the GPUs that run them (and a clear refusal elsewhere), and experts that tensor parallelism
does not split (etp)."""

import json

import pytest

from collect import REPO
from collect.hardware.records import load_hardware
from collect.schema import Plan, RunSpec, Workload, framework_conventions
from gnn.costs.analytic import block_costs
from gnn.costs.collectives import dispatch_remote_share
from gnn.costs.gpu import forward_seconds
from gnn.costs.hardware import HardwareModel
from gnn.costs.layers import layer_shape
from gnn.graph.build import build_graph
from gnn.graph.table import KINDS
from gnn.sim.simulate import simulate

HF = REPO / "experiments" / "requests" / "hf"
BATCH = {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 4096}
GB200 = HardwareModel(load_hardware("gb200-nvl72"))


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
    rates = (1 / hw.compute_time(1.0, "mxfp8"), 1 / hw.compute_time(1.0, "bfloat16"))
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
