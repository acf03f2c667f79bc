"""The llama and moe models really run on gloo ranks: each family and each dimension the collector measures, with
finite times and a peak no smaller than the rank's share of the parameters; and expert parallelism computes what
the unsharded layer computes (the all-to-all dispatch and combine send every token to the rank holding its expert
and bring it back in place, forward and backward). Multi-head latent attention too, under FSDP with checkpointing,
pipelining and expert parallelism."""

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh

from collect.launch.pool import LocalPool
from collect.measure.plan import MeasureSettings
from collect.schema import Workload, collect_problems
from collect.workloads.llama import LatentAttention, Llama
from collect.workloads.moe import MoE
from tests.conftest import tiny_spec

pytestmark = pytest.mark.distributed
SETTINGS = MeasureSettings(warmup_iters=0, timed_iters=2)
LLAMA = dict(family="llama", layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, seq_len=16, vocab=128)
MOE = dict(
    family="moe", layers=2, hidden=64, heads=4, kv_heads=2, experts=4, top_k=2, expert_ffn_hidden=48, seq_len=16,
    vocab=128,
)  # fmt: skip
# multi-head latent attention (collect.workloads.llama.LatentAttention): with a query latent, and without (moe)
MLA = dict(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=24)  # v as wide as q, k: fused on CPU
MLA_LLAMA = dict(LLAMA, kv_heads=None, q_lora_rank=24, **MLA)
MLA_MOE = dict(MOE, kv_heads=None, **MLA)
TWO_RANK = {
    "llama_fsdp_tied": (dict(LLAMA, tied_embeddings=True), dict(dp=2, sharding="fsdp_full")),
    "llama_tp_gqa_tied": (dict(LLAMA, tied_embeddings=True), dict(tp=2, sequence_parallel=True)),
    "llama_ddp": (LLAMA, dict(dp=2)),
    "llama_zero1_recompute": (LLAMA, dict(dp=2, sharding="zero1", recompute="selective")),
    "llama_pp_1f1b": (LLAMA, dict(pp=2, pp_schedule="1f1b", num_microbatches=2)),
    "moe_ep2_fsdp": (MOE, dict(dp=2, ep=2, sharding="fsdp_grad_op")),
    "moe_ddp_no_ep": (dict(MOE, shared_experts=1), dict(dp=2)),
    "moe_pp_recompute": (MOE, dict(pp=2, num_microbatches=2, recompute="full")),
    "moe_ep2_full_recompute": (MOE, dict(dp=2, ep=2, sharding="fsdp_full", recompute="full", num_microbatches=2)),
    "llama_mla_fsdp_selective": (MLA_LLAMA, dict(dp=2, sharding="fsdp_full", recompute="selective")),
    "llama_mla_pp_recompute": (MLA_LLAMA, dict(pp=2, pp_schedule="1f1b", num_microbatches=2, recompute="full")),
    "moe_mla_ep2_fsdp_full": (MLA_MOE, dict(dp=2, ep=2, sharding="fsdp_full")),
}
FOUR_RANK = {
    "moe_ep4_fsdp_full": (MOE, dict(dp=4, ep=4, sharding="fsdp_full")),
    "moe_ep2_of_dp4": (dict(MOE, first_dense_layers=1, ffn_hidden=96), dict(dp=4, ep=2, sharding="fsdp_full")),
    "moe_ep2_pp2_recompute": (MOE, dict(pp=2, dp=2, ep=2, sharding="fsdp_grad_op", num_microbatches=2)),
    # one expert per ep rank, two ranks holding it: FSDP shards the experts along their second dimension
    "moe_one_expert_per_rank_fsdp": (dict(MOE, experts=2, top_k=1), dict(dp=4, ep=2, sharding="fsdp_full")),
    "llama_dp_tp_fsdp": (LLAMA, dict(dp=2, tp=2, sharding="fsdp_grad_op")),
}


@pytest.fixture(scope="module")
def pools():
    with LocalPool(2, SETTINGS, deadline_s=120) as two, LocalPool(4, SETTINGS, deadline_s=180) as four:
        yield {2: two, 4: four}


def _measure(pool, workload, plan):
    spec = tiny_spec(workload={**workload, "micro_batch_size": 2}, **plan)
    assert not collect_problems(spec.workload, spec.plan, spec.cluster)
    result = pool.run(spec)
    assert result.status == "ok", result.error
    assert all(math.isfinite(t) and t > 0 for t in result.iter_times_s)
    # at least this rank's share of the fp32 parameters, at most 100x all of them with their optimizer state
    params = 4 * spec.workload.num_params
    assert min(result.peak_mem_bytes_per_rank) >= params / spec.cluster.world_size
    assert result.peak_mem_bytes <= 100 * 4 * params
    return result


@pytest.mark.parametrize("name", TWO_RANK)
def test_two_rank_family_plan(pools, name):
    _measure(pools[2], *TWO_RANK[name])


@pytest.mark.parametrize("workload", [MLA_LLAMA, MLA_MOE], ids=["llama", "moe"])
def test_mla_model_has_the_schemas_parameter_count(workload):
    w = tiny_spec(workload={**workload, "micro_batch_size": 2}).workload
    with torch.device("meta"):
        model = Llama(w)
    assert isinstance(model.layers["0"].attention, LatentAttention)
    assert sum(p.numel() for p in model.parameters()) == w.num_params


@pytest.mark.parametrize("name", FOUR_RANK)
def test_four_rank_family_plan(pools, name):
    _measure(pools[4], *FOUR_RANK[name])


def test_expert_parallelism_holds_fewer_expert_bytes(pools):
    """ep's point, measured: experts split over 4 ranks leave each a smaller peak than every rank holding all."""
    wide = dict(MOE, hidden=128, experts=8, expert_ffn_hidden=256)
    plan = dict(dp=4, sharding="fsdp_grad_op")
    whole, split = _measure(pools[4], wide, plan), _measure(pools[4], wide, dict(plan, ep=4))
    assert split.peak_mem_bytes < whole.peak_mem_bytes


EP = 2
EP_LAYER = Workload(
    family="moe", layers=1, hidden=16, heads=2, experts=4, top_k=2, expert_ffn_hidden=8, shared_experts=1,
    seq_len=8, vocab=32, micro_batch_size=3, global_batch_size=3,
)  # fmt: skip


def _layer() -> MoE:
    torch.manual_seed(0)
    layer = MoE(EP_LAYER)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)  # large enough that the router's top-k differs token to token
    return layer


def _rank(rank: int, port: int, failures) -> None:
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=EP)
        x = torch.randn(3, 8, 16, generator=torch.Generator().manual_seed(rank), requires_grad=True)
        whole = _layer()
        expected = whole(x)
        expected.sum().backward()
        expected_dx, x.grad = x.grad, None

        split = _layer()
        full = {k: v.clone() for k, v in split.experts.state_dict().items()}
        split.shard_experts(init_device_mesh("cpu", (EP,), mesh_dim_names=("ep",)))
        local = EP_LAYER.experts // EP
        split.experts.to_empty(device="cpu")
        split.experts.load_state_dict({k: v[rank * local : (rank + 1) * local] for k, v in full.items()})
        got = split(x)
        got.sum().backward()
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(x.grad, expected_dx)
        dist.destroy_process_group()
    except BaseException as exc:
        failures.put(f"rank {rank}: {exc!r}")
        raise


def test_expert_parallel_layer_matches_the_unsharded_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    failures = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_rank, args=(port, failures), nprocs=EP)
    assert failures.empty()
