"""A GPU preset prices collectives as NCCL's tuning model does and compute kernel by kernel: hand computations."""

import math

import pytest

from collect.hardware.records import load_hardware
from collect.schema import RunSpec
from gnn.costs.gpu import ASSUMED_KERNEL_GAP_S, Rate
from gnn.costs.hardware import HardwareModel
from gnn.graph.build import build_graph
from gnn.sim.simulate import simulate

H100 = HardwareModel(load_hardware("h100-80gb"))
# the datasheet model alone: the preset less the kernel table it names (tests/gnn/kernels prices from the table)
DATASHEET = HardwareModel(
    load_hardware("h100-80gb") | {"kernels": load_hardware("h100-80gb")["kernels"] | {"table": None}}
)
BF16 = Rate(989.4e12, "bfloat16")
NVLINK, NIC = 450e9, 50e9  # the preset's per-GPU NVLink and InfiniBand bandwidths


def test_an_all_reduce_inside_a_node_is_latency_plus_the_ring_over_nvlink():
    steps = 2 * 7
    simple = (8.4 + steps * 3.4) * 1e-6 + 1e9 / (NVLINK * 8 / steps)
    assert H100.comm_time("all_reduce", 1e9, 8) == pytest.approx(simple)


def test_a_small_all_reduce_takes_the_low_latency_protocol():
    steps = 2 * 7
    ll = (6.6 + steps * 0.47) * 1e-6 + 1e3 / (NVLINK * 8 / steps / 4)
    assert H100.comm_time("all_reduce", 1e3, 8) == pytest.approx(ll)


def test_across_nodes_a_group_moves_its_data_through_one_nic_per_rank_on_a_node():
    # 16 ranks: a tp group over 2 nodes has 8 per node (8 NICs); a dp group strided by tp 8, one per node over 16
    steps = 2 * 15
    latency = (8.4 + (steps - 2) * 3.4 + 2 * 9.6) * 1e-6
    eight = latency + 1e9 / (min(NVLINK, 8 * NIC) * 16 / steps)
    one = (8.4 + steps * 9.6) * 1e-6 + 1e9 / (NIC * 16 / steps)
    assert H100.comm_time("all_reduce", 1e9, 16, True, 8) == pytest.approx(eight)
    assert H100.comm_time("all_reduce", 1e9, 16, True, 1) == pytest.approx(one)


def test_an_a100_prices_what_nccl_tests_measured_on_its_links():
    """The A100 presets hold what nccl-tests reached on the same links (links.measured_nccl): a share of each
    link's datasheet bandwidth, and a message at which the Simple protocol reaches half of it."""
    a100 = load_hardware("a100-80gb")
    measured, nccl = HardwareModel(a100), a100["links"]["measured_nccl"]
    steps, share, half = 2 * 7, nccl["intra_node_share"], nccl["half_bandwidth_bytes"]
    simple = (8.4 + steps * 3.4) * 1e-6 + (1e9 + half) / (300e9 * share * 8 / steps)
    assert measured.comm_time("all_reduce", 1e9, 8) == pytest.approx(simple)
    datasheet = HardwareModel(a100 | {"links": {k: v for k, v in a100["links"].items() if k != "measured_nccl"}})
    assert datasheet.comm_time("all_reduce", 1e9, 8) < measured.comm_time("all_reduce", 1e9, 8)
    assert "nccl_tests_echo_azure_a100" in nccl["source"]


def test_an_all_gather_message_is_one_rank_shard():
    shard = 1e8
    steps = 7
    expected = (8.4 + steps * 3.4) * 1e-6 + 8 * shard / (NVLINK * 8 / steps)
    assert H100.comm_time("all_gather", shard, 8) == pytest.approx(expected)


def test_a_large_square_gemm_runs_at_the_gemm_efficiency_less_wave_quantization():
    k = DATASHEET.kernels
    m = 4096
    tiles = 32 * 32  # 128 x 128 tiles, one k slice each (they fill the SMs)
    waves = math.ceil(tiles / 132)
    expected = 2 * m**3 / (989.4e12 * 0.8 * tiles / (waves * 132)) + ASSUMED_KERNEL_GAP_S
    assert k.gemm_seconds(m, m, m, BF16, 2) == pytest.approx(expected)


def test_a_gemm_with_few_output_tiles_splits_k_to_fill_the_sms():
    k = DATASHEET.kernels
    m, kk, n = 1024, 65536, 1024
    tiles, split = 64, 2  # 132 // 64: two slices of k per output tile, 128 of 132 SMs busy
    expected = 2 * m * kk * n / (989.4e12 * 0.8 * tiles * split / 132) + ASSUMED_KERNEL_GAP_S
    assert k.gemm_seconds(m, kk, n, BF16, 2) == pytest.approx(expected)


def test_a_skinny_gemm_is_bound_by_its_bytes():
    k = DATASHEET.kernels
    for m, kk, n in ((8, 8192, 8192), (4096, 2048, 64)):  # a few tokens on a big weight; a tp = 32 shard
        assert k.gemm_seconds(m, kk, n, BF16, 2) == pytest.approx(
            2 * (m * kk + kk * n + m * n) / 3.35e12 + ASSUMED_KERNEL_GAP_S
        )


def test_measured_fingerprints_keep_their_own_pricing():
    assert HardwareModel({"id": "cpu", "source": "measured", "compute": []}).kernels is None


def _llama_time(tp: int) -> tuple[float, float]:
    w = {"family": "llama", "layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8, "ffn_hidden": 8192}
    w |= {"seq_len": 4096, "vocab": 128256, "micro_batch_size": 1, "global_batch_size": 8, "dtype": "bfloat16"}
    spec = RunSpec.model_validate(
        {
            "workload": w,
            "plan": {"dp": 8 // tp, "tp": tp, "num_microbatches": tp},
            "cluster": {"devices_per_node": 8, "memory_bytes": 80 * 2**30, "device": "cuda"},
        }
    )
    r = simulate(build_graph(spec.workload, spec.plan, spec.cluster, H100))
    return r.iter_time_s, r.compute_s


def test_tensor_parallelism_makes_a_small_model_slower_per_flop():
    """Same tokens per GPU: tp 8 shards every GEMM eight ways (skinny, quantized tiles) and adds collectives."""
    t1, c1 = _llama_time(1)
    t8, c8 = _llama_time(8)
    assert c8 > 1.2 * c1
    assert t8 > c8


def test_a_small_all_reduce_over_many_nodes_takes_the_tree():
    """At 128 nodes a ring pays 2 x 127 network steps; NCCL's tree pays 2 x log2(128) hops (tuning.cc)."""
    ring = (8.4 + 2 * 127 * 9.6) * 1e-6 + 1e6 / (NIC * 128 / (2 * 127))
    tree_simple = 2 * 7 * 50.0 * 1e-6 + 1e6 / (0.5 * 0.9 * NIC)
    tree_ll = (4.4 + 2 * 7 * 5.0) * 1e-6 + 1e6 / (0.5 * 0.9 * NIC / 3.8)
    assert H100.comm_time("all_reduce", 1e6, 128, True, 1) == pytest.approx(min(tree_simple, tree_ll))
    assert min(tree_simple, tree_ll) < ring


def _dp_spec(cluster: dict | None = None, framework: str = "torch", sharding: str = "none") -> RunSpec:
    from collect.schema import framework_conventions

    w = {"family": "llama", "layers": 8, "hidden": 2048, "heads": 16, "kv_heads": 8, "ffn_hidden": 8192}
    w |= {"seq_len": 2048, "vocab": 32000, "micro_batch_size": 1, "global_batch_size": 64, "dtype": "bfloat16"}
    plan = {"dp": 32, "num_microbatches": 2, "sharding": sharding, **framework_conventions(framework, 1)}
    base = {"nodes": 4, "devices_per_node": 8, "memory_bytes": 80 * 2**30, "device": "cuda", "backend": "nccl"}
    return RunSpec.model_validate({"workload": w, "plan": plan, "cluster": base | (cluster or {})})


def _dp_seconds(spec: RunSpec) -> float:
    g = build_graph(spec.workload, spec.plan, spec.cluster, H100)
    return float(g.column("est_time")[g.column("kind") == 6].sum())  # dp_comm


def test_a_cluster_with_fewer_nics_pays_for_its_gradients_and_an_nvlink_rack_does_not():
    dgx = _dp_seconds(_dp_spec())
    two_nics = _dp_seconds(_dp_spec({"nics_per_node": 2}))  # a quarter of DGX's network per GPU
    rack = _dp_seconds(_dp_spec({"nvlink_domain": 32}))  # all 32 GPUs on one NVLink fabric
    assert two_nics > 1.5 * dgx and rack < dgx
    with pytest.raises(ValueError, match="nvlink_domain"):
        _dp_spec({"nvlink_domain": 12})


def test_megatron_hides_its_gradient_reduction_under_the_backward():
    spec = _dp_spec(framework="megatron", sharding="zero1")
    exposed = _dp_seconds(spec)
    serial = _dp_seconds(spec.model_copy(update={"plan": spec.plan.model_copy(update={"grad_reduce_overlap": False})}))
    assert exposed < serial
    slowest = simulate(build_graph(spec.workload, spec.plan, spec.cluster, H100)).iter_time_s
    assert exposed > 0 and slowest > exposed


def _tp_seconds(overlap: bool, hw: HardwareModel = H100) -> float:
    w = {"family": "llama", "layers": 8, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn_hidden": 28672}
    w |= {"seq_len": 8192, "vocab": 128256, "micro_batch_size": 1, "global_batch_size": 2, "dtype": "bfloat16"}
    plan = {"dp": 2, "tp": 4, "sequence_parallel": True, "num_microbatches": 1, "tp_comm_overlap": overlap}
    cluster = {"devices_per_node": 8, "memory_bytes": 80 * 2**30, "device": "cuda", "backend": "nccl"}
    spec = RunSpec.model_validate({"workload": w, "plan": plan, "cluster": cluster})
    g = build_graph(spec.workload, spec.plan, spec.cluster, hw)
    return float(g.column("est_time")[g.column("kind") == 5].sum())  # tp_comm


def test_nemo_hides_tensor_parallel_collectives_under_the_gemms_but_never_the_first_chunk():
    serial, overlapped = _tp_seconds(False), _tp_seconds(True)
    assert serial / 4 <= overlapped < serial  # a 70B layer's GEMMs hide all but the first of tp 4 chunks
    assert overlapped == pytest.approx(serial / 4)
    # the datasheet's GEMMs hide the same collectives: the overlap is priced wherever kernels are
    assert _tp_seconds(True, DATASHEET) < _tp_seconds(False, DATASHEET)
