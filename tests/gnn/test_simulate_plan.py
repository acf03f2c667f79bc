"""Simulating two short runs (pp + 1 and 2 * pp + 1 micro-batches) and extrapolating must match simulating them all."""

import pytest

from collect.schema import RunSpec
from gnn.costs.hardware import hardware_model
from gnn.graph.build import build_graph
from gnn.sim.plan import sampled_counts, simulate_plan
from gnn.sim.simulate import simulate

A100 = hardware_model("a100-80gb", "data/hardware")
PLANS = [
    dict(dp=8, num_microbatches=8),
    dict(dp=4, tp=2, sharding="fsdp_grad_op", recompute="full", num_microbatches=16),
    dict(dp=4, pp=2, pp_schedule="gpipe", sharding="zero1", num_microbatches=16),
    dict(dp=2, pp=4, pp_schedule="1f1b", recompute="selective", num_microbatches=16),
    dict(pp=4, tp=2, pp_schedule="interleaved_1f1b", virtual_stages=2, num_microbatches=24),
    dict(dp=2, pp=2, tp=2, pp_schedule="1f1b", sharding="fsdp_full", sequence_parallel=True, num_microbatches=8),
    # the last stage's peak moves from its optimizer to the merge of its kept outputs past the sampled counts: a line
    # through the two sampled peaks misses it by 8%
    dict(dp=2, pp=4, pp_schedule="1f1b", recompute="full", num_microbatches=32),
]


def spec(plan: dict) -> RunSpec:
    dp = plan.get("dp", 1)
    workload = dict(
        layers=8,
        hidden=1024,
        heads=16,
        seq_len=1024,
        vocab=51200,
        micro_batch_size=1,
        global_batch_size=dp * plan["num_microbatches"],
        dtype="bfloat16",
    )
    cluster = dict(devices_per_node=8, device="cuda", device_kind="a100-80gb", memory_bytes=80 * 2**30, backend="nccl")
    return RunSpec.model_validate({"workload": workload, "plan": plan, "cluster": cluster})


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_extrapolation_matches_the_full_simulation(plan):
    s = spec(plan)
    assert sampled_counts(s.plan) is not None  # the case under test: the plan is long enough to truncate
    full = simulate(build_graph(s.workload, s.plan, s.cluster, A100))
    graph, short = simulate_plan(s.workload, s.plan, s.cluster, A100)
    assert short.iter_time_s == pytest.approx(full.iter_time_s, rel=1e-3)
    assert short.peak_mem_per_rank == pytest.approx(full.peak_mem_per_rank, rel=1e-6)
    for name in ("compute_s", "comm_s", "exposed_comm_s"):
        assert getattr(short, name) == pytest.approx(getattr(full, name), rel=1e-3, abs=1e-9)
    assert short.bubble_s == pytest.approx(full.bubble_s, abs=1e-3 * full.iter_time_s)
    assert (
        graph.plan.num_microbatches == sampled_counts(s.plan)[0] < s.plan.num_microbatches
    )  # the model reads a short graph


def test_short_plans_are_simulated_whole():
    s = spec(dict(dp=2, pp=4, pp_schedule="1f1b", num_microbatches=8))
    graph, result = simulate_plan(s.workload, s.plan, s.cluster, A100)
    assert sampled_counts(s.plan) is None and graph.plan is s.plan
    assert result.iter_time_s == simulate(build_graph(s.workload, s.plan, s.cluster, A100)).iter_time_s
