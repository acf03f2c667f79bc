"""Execution graphs of tiny hand-built plans, checked node by node."""

from collections import Counter

import numpy as np
import pytest

from collect.schema import RunSpec
from gnn.costs.hardware import HardwareModel
from gnn.graph.build import build_graph
from gnn.graph.schedule import rank_orders

W = dict(layers=4, hidden=64, heads=4, seq_len=32, vocab=128, micro_batch_size=2)


class UnitHardware(HardwareModel):
    """1 GFLOP/s compute, 1 GB/s links with no latency: easy numbers."""

    def __init__(self):
        self.id, self.measured, self.blocks, self.kernels, self.devices_per_node = "unit", True, None, None, 1 << 30

    def compute_time(self, flops, dtype):
        return flops / 1e9

    def comm_time(self, op, message_bytes, group, crosses_node=False, per_node=None, inter_bw=None, remote_share=1.0):
        return 0.0 if group <= 1 else message_bytes / 1e9


def graph(workload=None, **plan):
    dp, nmb = plan.get("dp", 1), plan.get("num_microbatches", 1)
    w = {**W, **(workload or {}), "global_batch_size": dp * W["micro_batch_size"] * nmb}
    ws = dp * plan.get("tp", 1) * plan.get("pp", 1)
    cluster = {"devices_per_node": ws, "memory_bytes": 2**30}
    spec = RunSpec.model_validate({"workload": w, "plan": plan, "cluster": cluster})
    return build_graph(spec.workload, spec.plan, spec.cluster, UnitHardware()), spec


def kinds(g, phase=None):
    return Counter(n.kind for n in g.nodes if phase is None or n.phase == phase)


def test_ddp_plan_nodes_and_gradient_all_reduce():
    g, spec = graph(dp=2)
    assert kinds(g, "forward") == {"embed": 1, "attn": 1, "mlp": 1, "head": 1}
    assert kinds(g, "backward") == {"head": 1, "mlp": 1, "attn": 1, "embed": 1, "dp_comm": 1}
    assert kinds(g, "step") == {"optimizer": 1}
    (ar,) = [n for n in g.nodes if n.kind == "dp_comm"]
    assert ar.group == 2 and ar.count == 1
    assert ar.message_bytes == spec.workload.num_params * 4  # fp32 gradients, one bucket
    attn = next(n for n in g.nodes if n.kind == "attn" and n.phase == "forward")
    assert attn.count == 4  # four layers compressed into one node
    b, s, d = 2, 32, 64
    assert attn.flops == 4 * (8 * b * s * d * d + 4 * b * s * s * d)


def test_tensor_parallel_collectives_per_block_and_phase():
    g, _ = graph(tp=2)
    tp = [n for n in g.nodes if n.kind == "tp_comm"]
    assert Counter(n.phase for n in tp) == {"forward": 2, "backward": 2}
    assert all(n.group == 2 and n.count == 4 and n.message_bytes == 2 * 32 * 64 * 4 for n in tp)
    assert "dp_comm" not in kinds(g)


def test_pipeline_send_recv_and_gpipe_order():
    g, _ = graph(pp=2, pp_schedule="gpipe", num_microbatches=2)
    sends = [n for n in g.nodes if n.kind == "p2p" and n.phase != "step"]
    assert Counter((n.phase, n.stage) for n in sends) == {("forward", 0): 2, ("backward", 1): 2}
    assert all(n.message_bytes == 2 * 32 * 64 * 4 for n in sends)
    # GPipe waits its backward sends when the schedule ends: stage 1's rank frees the two input gradients they held
    (waited,) = [n for n in g.nodes if n.kind == "p2p" and n.phase == "step"]
    assert waited.stage == 1 and waited.free_bytes == 2 * (2 * 32 * 64 * 4)
    # stage 0 embeds, stage 1 has the head
    assert kinds(g, "forward")["embed"] == 2 and kinds(g, "forward")["head"] == 2
    assert g.num_ranks == 2


def test_fsdp_full_gathers_every_pass_and_reduce_scatters():
    g, spec = graph(dp=2, sharding="fsdp_full", num_microbatches=2)
    assert Counter((n.kind, n.phase) for n in g.nodes if n.kind.startswith("fsdp")) == {
        ("fsdp_allgather", "forward"): 2,
        ("fsdp_allgather", "backward"): 2,
        ("fsdp_reducescatter", "backward"): 2,
    }
    # one all-gather per FSDP unit (each block, and the root: embeddings and head), each of its unit's shard
    gather = next(n for n in g.nodes if n.kind == "fsdp_allgather")
    assert gather.count == spec.workload.layers + 1
    assert gather.count * gather.message_bytes == pytest.approx(spec.workload.num_params * 4 / 2)
    scatter = next(n for n in g.nodes if n.kind == "fsdp_reducescatter")
    assert scatter.count == spec.workload.layers + 1


def test_pipelined_fsdp_grad_op_gathers_and_reduce_scatters_once_per_stage():
    """torch.distributed.pipelining turns off FSDP's gradient sync until the last micro-batch's backward is done,
    then reduce-scatters once; without pipelining every micro-batch reduce-scatters."""
    g, _ = graph(dp=2, pp=2, sharding="fsdp_grad_op", num_microbatches=2)
    assert Counter((n.kind, n.phase) for n in g.nodes if n.kind.startswith("fsdp")) == {
        ("fsdp_allgather", "forward"): 2,
        ("fsdp_reducescatter", "backward"): 2,
    }
    g, _ = graph(dp=2, sharding="fsdp_grad_op", num_microbatches=2)
    assert kinds(g)["fsdp_reducescatter"] == 2


def test_zero1_all_gathers_parameters_after_the_step():
    g, _ = graph(dp=2, sharding="zero1")
    assert kinds(g)["zero_allgather"] == 1 and kinds(g)["dp_comm"] == 1


def test_recompute_adds_a_recompute_pass_and_saves_less():
    plain, _ = graph(dp=2)
    full, _ = graph(dp=2, recompute="full")
    assert kinds(full, "recompute") == {"attn": 1}
    saved = lambda g: sum(n.alloc_bytes for n in g.nodes if n.phase == "forward")
    assert saved(full) < saved(plain) / 5


@pytest.mark.parametrize(
    "schedule, expected",
    [
        (
            "gpipe",
            [
                [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("B", 0, 0), ("B", 0, 1), ("B", 0, 2)],
                [("F", 1, 0), ("F", 1, 1), ("F", 1, 2), ("B", 1, 0), ("B", 1, 1), ("B", 1, 2)],
            ],
        ),
        (
            "1f1b",
            [
                [("F", 0, 0), ("F", 0, 1), ("B", 0, 0), ("F", 0, 2), ("B", 0, 1), ("B", 0, 2)],
                [("F", 1, 0), ("B", 1, 0), ("F", 1, 1), ("B", 1, 1), ("F", 1, 2), ("B", 1, 2)],
            ],
        ),
    ],
)
def test_schedule_orders(schedule, expected):
    from collect.schema import Plan

    assert rank_orders(Plan(pp=2, pp_schedule=schedule, num_microbatches=3)) == expected


def test_interleaved_order_loops_chunks_and_covers_every_pass():
    from collect.schema import Plan

    orders = rank_orders(Plan(pp=2, pp_schedule="interleaved_1f1b", virtual_stages=2, num_microbatches=4))
    assert orders[1][:4] == [("F", 1, 0), ("F", 1, 1), ("F", 3, 0), ("B", 3, 0)]
    for rank, order in enumerate(orders):
        assert sorted(order) == sorted((p, s, m) for p in "FB" for s in (rank, rank + 2) for m in range(4))


def test_graph_edges_point_forward():
    """The compiler adds a node after its dependencies: every edge goes to a later node."""
    g, _ = graph(pp=2, dp=2, pp_schedule="interleaved_1f1b", virtual_stages=2, num_microbatches=4, sharding="fsdp_full")
    assert all(src < dst for src, dst, _ in g.edges)


def test_cached_layouts_and_shared_passes_build_the_same_graph():
    """A pipeline shape's layout is cached and reused by other models; the graph must not depend on what was
    built before it."""
    from gnn.graph import layout

    plan = dict(pp=2, dp=2, pp_schedule="1f1b", num_microbatches=3, sharding="fsdp_grad_op")
    layout.clear_layouts()
    cold, _ = graph(**plan)
    other, _ = graph({"hidden": 128, "layers": 8}, **plan)  # same layout, another model
    warm, _ = graph(**plan)
    assert np.array_equal(cold.table, warm.table) and np.array_equal(cold.edge_index, warm.edge_index)
    # the other model's passes have other costs but the same shapes: one placement serves all three
    assert other.structure is cold.structure is warm.structure and not np.array_equal(other.table, cold.table)
    assert np.array_equal(other.edge_index, cold.edge_index)


def test_graph_table_reads_back_as_nodes():
    from gnn.graph.build import ExecGraph

    g, _ = graph(pp=2, tp=2, num_microbatches=2, recompute="full")
    again = ExecGraph.from_nodes(g.nodes, g.edges, g.static_bytes)
    assert np.array_equal(again.table, g.table) and g.edges == again.edges
    assert g.num_nodes == len(g.nodes) and {n.kind for n in g.nodes} >= {"attn", "mlp", "tp_comm", "p2p", "optimizer"}


@pytest.mark.parametrize(
    "plan",
    [
        dict(pp=2, dp=2, pp_schedule="1f1b", num_microbatches=3, sharding="fsdp_full"),
        dict(pp=2, pp_schedule="interleaved_1f1b", virtual_stages=2, num_microbatches=4, tp=2, recompute="selective"),
        dict(dp=2, sharding="zero1", num_microbatches=2),
    ],
)
def test_pass_graph_summarises_the_node_graph(plan):
    """The GNN's graph has a node per pass: its data edges are exactly the node graph's data edges between
    passes, its order edges chain each rank's passes (the node graph's streams may skip a pass that does not use
    them), and its features add up to the node graph's totals."""
    from gnn.dataset.features import NODE_FEATURES, node_features

    g, spec = graph(**plan)
    view = g.passes
    pass_of = np.repeat(np.arange(len(view.start)), np.diff(np.append(view.start, g.num_nodes)))
    stage = g.column("stage")
    assert np.array_equal(stage[view.start], [stage[pass_of == p][0] for p in range(len(view.start))])
    between = {(a, b, k) for (a, b), k in zip(pass_of[g.edge_index].T.tolist(), g.edge_kind.tolist()) if a != b}
    edges = {(a, b, k) for (a, b), k in zip(view.edge_index.T.tolist(), view.edge_kind.tolist())}
    assert {e for e in between if e[2] == 0} == {e for e in edges if e[2] == 0}
    assert {e for e in edges if e[2] == 1} <= between
    rank = g.column("rank")[view.start]
    for a, b, _ in between - edges:  # a stream skipping passes: on one rank, implied by the chain
        next_on_rank = min(c for c in range(a + 1, len(rank)) if rank[c] == rank[a])
        assert rank[a] == rank[b] and a < next_on_rank < b and (a, next_on_rank, 1) in edges
    x = node_features(g)
    assert x.shape == (len(view.start), len(NODE_FEATURES))
    flops = np.expm1(x[:, NODE_FEATURES.index("log_mflops")].astype(np.float64)).sum() * 1e6
    assert flops == pytest.approx(g.column("flops").sum(), rel=1e-5)
    steps = x[:, NODE_FEATURES.index("pass_step")] == 1
    assert steps.sum() == spec.plan.pp and x[steps, NODE_FEATURES.index("log_optimizer_us")].min() > 0
    assert (x[~steps, NODE_FEATURES.index("log_optimizer_us")] == 0).all()


def test_hand_built_graph_is_its_own_pass_graph():
    from gnn.graph.build import ExecGraph

    g, _ = graph(pp=2, num_microbatches=2)
    again = ExecGraph.from_nodes(g.nodes, g.edges, g.static_bytes)
    assert len(again.passes.start) == again.num_nodes
    assert np.array_equal(again.passes.edge_index, again.edge_index)


def test_plans_of_a_batch_share_compilers_and_passes_without_changing_their_graphs():
    """Plans that differ only in a schedule their passes read alike share a pass compiler, and plans that differ
    only in how they shard share the passes and optimizer steps that do not read it; their graphs and simulations
    are those of fresh compilers."""
    from gnn.graph.passes import PassCompiler
    from gnn.sim.plan import simulate_plan

    hw, cache = UnitHardware(), {}
    plans = [
        dict(pp=pp, dp=dp, pp_schedule=schedule, num_microbatches=8, sharding=sharding, recompute=recompute, **holds)
        for pp, schedule, holds in [(1, None, {}), (2, "1f1b", {}), (2, "gpipe", {}), (4, "1f1b", {})]
        + [(2, schedule, dict(pipeline_holds_buffers=False)) for schedule in ("1f1b", "gpipe")]
        for dp in (1, 2)
        for sharding in ("none", "zero1", "fsdp_grad_op", "fsdp_full")
        for recompute in ("none", "full")
    ]
    for plan in plans:
        _, spec = graph(**plan)
        shared, shared_sim = simulate_plan(spec.workload, spec.plan, spec.cluster, hw, cache)
        fresh, fresh_sim = simulate_plan(spec.workload, spec.plan, spec.cluster, hw)
        assert np.array_equal(shared.table, fresh.table) and np.array_equal(shared.edge_index, fresh.edge_index), plan
        assert shared_sim.iter_time_s == fresh_sim.iter_time_s
        assert shared_sim.peak_mem_per_rank == fresh_sim.peak_mem_per_rank
    compilers = [c for c in cache.values() if isinstance(c, PassCompiler)]
    # pp 2's two schedules share a compiler (per dp, sharding, recompute) where pipelining holds no buffers; where it
    # does, GPipe's passes hold their sends to the schedule's end and 1F1B's do not
    assert len(compilers) == len(plans) - 2 * 4 * 2
    placed = [t for c in compilers for t in c.templates.values()]
    assert len({id(t) for t in placed}) < 0.8 * len(placed)


def test_megatron_ddp_and_distributed_optimizer_with_tp_hold_a_tp_shard_and_sync_over_dp():
    """Predicted only (torch's DDP and ZeroRedundancyOptimizer cannot hold DTensors), yet Megatron's most common
    plans. Per parameter of its tp shard a rank keeps fp32 weights (4 bytes) and Adam's two moments (8); DDP adds
    its gradient buckets (4); the distributed optimizer (zero1) splits the moments over dp."""
    alone, _ = graph(tp=2)
    ddp, _ = graph(dp=2, tp=2)
    zero1, _ = graph(dp=2, tp=2, sharding="zero1")
    per_param = alone.static_bytes[0] / 12
    assert ddp.static_bytes[0] == pytest.approx(16 * per_param)
    assert zero1.static_bytes[0] == pytest.approx(12 * per_param)
    (ar,) = [n for n in ddp.nodes if n.kind == "dp_comm"]
    assert ar.group == 2 and ar.message_bytes == pytest.approx(4 * per_param)
    assert kinds(zero1)["zero_allgather"] == 1 and kinds(ddp)["tp_comm"] == kinds(alone)["tp_comm"]


def test_uneven_stages_hold_their_own_layers():
    """6 layers on 4 stages of 2 ranks: 8 slots with the embedding and the loss, [1, 2, 2, 1] (Plan.stage_layers);
    a graph's layer nodes count each stage's own."""
    g, spec = graph(workload={"layers": 6}, pp=2, pp_schedule="interleaved_1f1b", virtual_stages=2, num_microbatches=2)
    assert spec.plan.stage_layers(6) == (1, 2, 2, 1)
    counts = {n.stage: n.count for n in g.nodes if n.kind == "attn" and n.phase == "forward"}
    assert counts == {0: 1, 1: 2, 2: 2, 3: 1}
    even, _ = graph(pp=2, num_microbatches=2)
    assert {n.count for n in even.nodes if n.kind == "attn"} == {2}
