"""The simulator against timelines computed by hand."""

import pytest

from gnn.graph.build import ExecGraph
from gnn.graph.table import Node
from gnn.sim.simulate import simulate
from tests.gnn.test_graph import graph


def _graph(nodes, edges, static=(0.0,)):
    return ExecGraph.from_nodes(nodes, edges, list(static))


def test_communication_overlaps_independent_compute():
    # rank 0: compute A (1 s), then all-reduce C (2 s) on the comm stream and compute B (1 s) in parallel
    a = Node("attn", "forward", 0, 0, 0, est_time=1.0)
    c = Node("dp_comm", "backward", 0, 0, 0, est_time=2.0)
    b = Node("mlp", "forward", 0, 0, 0, est_time=1.0)
    r = simulate(_graph([a, c, b], [(0, 1, "data"), (0, 2, "order")]))
    assert r.iter_time_s == pytest.approx(3.0)  # A, then max(B = 1, C = 2)
    assert r.compute_s == pytest.approx(2.0) and r.comm_s == pytest.approx(2.0)
    assert r.exposed_comm_s == pytest.approx(1.0) and r.bubble_s == 0  # idle [2, 3] while C runs


def test_compute_waits_for_a_blocking_collective():
    a = Node("attn", "forward", 0, 0, 0, est_time=1.0)
    c = Node("tp_comm", "forward", 0, 0, 0, est_time=0.5)
    b = Node("mlp", "forward", 0, 0, 0, est_time=1.0)
    r = simulate(_graph([a, c, b], [(0, 1, "data"), (1, 2, "data"), (0, 2, "order")]))
    assert r.iter_time_s == pytest.approx(2.5)


def test_two_stage_gpipe_timeline_by_hand():
    """pp=2, 2 micro-batches, GPipe, unit hardware: F = 1 s, B = 2 s per stage and micro-batch, no comm.

    rank0: F0 [0,1] F1 [1,2] .................. B0 [5,7] B1 [7,9] (B0 waits for rank1's B0)
    rank1:        F0 [1,2] F1 [2,3] B0 [3,5] B1 [5,7]
    """
    nodes, edges = [], []

    def add(kind, phase, rank, stage, mb, t, deps):
        nodes.append(Node(kind, phase, rank, stage, mb, est_time=t))
        edges.extend((d, len(nodes) - 1, "data") for d in deps)
        return len(nodes) - 1

    f00 = add("attn", "forward", 0, 0, 0, 1, [])
    f01 = add("attn", "forward", 0, 0, 1, 1, [f00])
    f10 = add("attn", "forward", 1, 1, 0, 1, [f00])
    f11 = add("attn", "forward", 1, 1, 1, 1, [f01, f10])
    b10 = add("attn", "backward", 1, 1, 0, 2, [f11])
    b11 = add("attn", "backward", 1, 1, 1, 2, [b10])
    b00 = add("attn", "backward", 0, 0, 0, 2, [f01, b10])
    add("attn", "backward", 0, 0, 1, 2, [b00, b11])
    r = simulate(ExecGraph.from_nodes(nodes, edges, [0.0, 0.0]))
    assert list(r.start) == [0, 1, 1, 2, 3, 5, 5, 7]
    assert r.iter_time_s == pytest.approx(9.0)
    assert r.bubble_s == pytest.approx(3.0)  # busiest rank computes 6 of 9 s
    assert r.exposed_comm_s == 0  # no transfers: all of the idle time is waiting on the other rank


def test_memory_replay_keeps_activations_until_backward():
    f0 = Node("attn", "forward", 0, 0, 0, est_time=1, alloc_bytes=10)
    f1 = Node("attn", "forward", 0, 0, 1, est_time=1, alloc_bytes=10)
    b0 = Node("attn", "backward", 0, 0, 0, est_time=1, free_bytes=10, transient_bytes=5)
    b1 = Node("attn", "backward", 0, 0, 1, est_time=1, free_bytes=10)
    order = [(0, 1, "order"), (1, 2, "order"), (2, 3, "order")]
    r = simulate(_graph([f0, f1, b0, b1], order, static=(100.0,)))
    assert r.peak_mem_bytes == pytest.approx(100 + 10 + 10 + 5)


def test_a_node_that_frees_while_it_allocates_adds_its_net_change():
    """A backward writing 30 bytes of gradients while releasing 40 of activations peaks at neither sum."""
    f = Node("attn", "forward", 0, 0, 0, est_time=1, alloc_bytes=40)
    b = Node("attn", "backward", 0, 0, 0, est_time=1, alloc_bytes=30, free_bytes=40)
    step = Node("optimizer", "step", 0, 0, -1, est_time=1, transient_bytes=5)
    r = simulate(_graph([f, b, step], [(0, 1, "order"), (1, 2, "order")], static=(100.0,)))
    assert r.peak_mem_bytes == pytest.approx(100 + 40)  # the forward's activations; then 100 + 30 + 5


def test_a_cyclic_graph_is_an_error_not_a_hang():
    a, b = Node("attn", "forward", 0, 0, 0, est_time=1.0), Node("mlp", "forward", 0, 0, 0, est_time=1.0)
    with pytest.raises(ValueError, match="cycle"):
        simulate(_graph([a, b], [(0, 1, "data"), (1, 0, "data")]))


def test_one_f_one_b_holds_fewer_activations_than_gpipe():
    gpipe, _ = graph(pp=2, pp_schedule="gpipe", num_microbatches=4)
    one_f, _ = graph(pp=2, pp_schedule="1f1b", num_microbatches=4)
    assert simulate(one_f).peak_mem_per_rank[0] < simulate(gpipe).peak_mem_per_rank[0]


def test_concurrent_transfers_on_a_rank_share_its_bandwidth():
    """A DP all-reduce and a pipeline send of 1 s each, at once on one rank: both end at 2 s."""
    ar = Node("dp_comm", "backward", 0, 0, 0, est_time=1.0)
    p2p = Node("p2p", "backward", 0, 0, 0, est_time=1.0)
    r = simulate(_graph([ar, p2p], []))
    assert list(r.end) == pytest.approx([2.0, 2.0])
    # a transfer on another rank does not share this rank's link
    other = Node("p2p", "backward", 1, 1, 0, est_time=1.0)
    r = simulate(_graph([ar, other], [], static=(0.0, 0.0)))
    assert list(r.end) == pytest.approx([1.0, 1.0])


def test_sharing_ends_when_one_transfer_finishes():
    short = Node("dp_comm", "backward", 0, 0, 0, est_time=0.5)
    long = Node("p2p", "backward", 0, 0, 0, est_time=1.0)
    r = simulate(_graph([short, long], []))
    # both at half rate until 1.0 s (short done), then long finishes its last 0.5 s alone
    assert list(r.end) == pytest.approx([1.0, 1.5])


def test_tensor_parallel_head_keeps_whole_logits_on_every_rank():
    """The collector's TP head is ColwiseParallel with a replicated output (collect/parallel/tp.py): its matmul is
    split by tp, but every rank then holds all the fp32 logits, and so does the loss."""
    from collect.schema import Plan, Workload
    from gnn.costs.analytic import block_costs

    w = Workload(layers=2, hidden=64, heads=2, seq_len=32, vocab=512, micro_batch_size=2, global_batch_size=4)
    one, two = block_costs(w, Plan()), block_costs(w, Plan(tp=2))
    assert two.head_flops == one.head_flops / 2
    assert two.logits_bytes == one.logits_bytes == 2 * 32 * 512 * 4
    # Megatron's vocab-parallel cross entropy keeps them sharded (plan.loss_parallel)
    assert block_costs(w, Plan(tp=2, loss_parallel=True)).logits_bytes == 2 * 32 * 512 * 4 / 2


def test_gpt_activations_keep_no_attention_scores():
    """32 bytes per token and hidden unit at 2-byte precision (the norms' inputs and outputs 8, q, k, v and the
    core's output 8, fc1's and GELU's outputs 16; no 5as^2 scores, which fused attention never keeps): linear in
    the sequence, by hand for a small fp32 case."""
    from collect.schema import Plan, Workload
    from gnn.costs.analytic import block_costs

    w = Workload(layers=2, hidden=64, heads=4, seq_len=32, vocab=128, micro_batch_size=2, global_batch_size=2)
    assert block_costs(w, Plan()).activation_bytes_per_layer == 2 * 32 * 64 * 32 * 4 / 2  # fp32: twice 2 bytes
    long = w.model_copy(update={"seq_len": 2048})
    assert (
        block_costs(long, Plan()).activation_bytes_per_layer == 64 * block_costs(w, Plan()).activation_bytes_per_layer
    )
