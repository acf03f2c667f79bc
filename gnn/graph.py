"""Compile (workload, plan, cluster, hardware) into a distributed execution graph.

In the spirit of Proteus's distributed execution graph (../shared/seeds/004):
nodes are compute blocks (embedding, attention, MLP, head/loss, per pipeline
stage, micro-batch and phase, plus the optimizer step) and communication (TP
all-reduce or reduce-scatter/all-gather, DP gradient all-reduce, FSDP
all-gather / reduce-scatter, ZeRO-1 parameter all-gather, pipeline send/recv).
Edges are data dependencies and each rank's program order on its streams
(compute, collectives, pipeline send/recv), which is where the pipeline
schedule lives.

Size: only pipeline ranks are expanded. DP and TP replicas are symmetric, so
they appear as group sizes on the collectives. A stage's repeated layers are
compressed into one attention and one MLP node with a layer count. The graph
grows with stages x micro-batches, not with GPU count.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from collect.schema import Cluster, Plan, Workload
from gnn.costs import (BlockCosts, block_costs, dtype_bytes, largest_param, saved_bytes_per_layer, stage_params,
                       state_bytes)
from gnn.hardware_model import HardwareModel
from gnn.schedule import rank_orders

KINDS = ("embed", "attn", "mlp", "head", "optimizer",
         "tp_comm", "dp_comm", "fsdp_allgather", "fsdp_reducescatter", "zero_allgather", "p2p")
COMM_KINDS = frozenset(KINDS[5:])
STREAMS = {**{k: 1 for k in COMM_KINDS}, "p2p": 2}
COLLECTIVE = {"dp_comm": "all_reduce", "fsdp_allgather": "all_gather", "fsdp_reducescatter": "reduce_scatter",
              "zero_allgather": "all_gather", "p2p": "send_recv"}  # tp_comm depends on sequence parallelism
PHASES = ("forward", "backward", "recompute", "step")
EDGE_KINDS = ("data", "order")
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb


@dataclass(slots=True)
class Node:
    kind: str
    phase: str
    rank: int
    stage: int
    microbatch: int
    count: int = 1  # compressed repeats (layers, collectives per layer)
    flops: float = 0.0
    message_bytes: float = 0.0  # per collective call, per rank
    group: int = 1
    crosses_node: bool = False
    alloc_bytes: float = 0.0  # kept after the node ends (saved activations)
    free_bytes: float = 0.0  # released when the node ends
    transient_bytes: float = 0.0  # live only while the node runs
    est_time: float = 0.0
    stream: int = field(init=False)  # 0 compute, 1 collectives, 2 pipeline send/recv (its own communicator, as in torch)

    def __post_init__(self):
        self.stream = STREAMS.get(self.kind, 0)


@dataclass
class ExecGraph:
    nodes: list[Node]
    edges: list[tuple[int, int, str]]
    static_bytes: list[float]  # resident state per pipeline rank
    plan: Plan
    workload: Workload
    globals: dict = field(default_factory=dict)

    @property
    def num_ranks(self) -> int:
        return len(self.static_bytes)


class _Builder:
    def __init__(self, w: Workload, plan: Plan, cluster: Cluster, hw: HardwareModel):
        self.w, self.plan, self.cluster, self.hw = w, plan, cluster, hw
        self.c: BlockCosts = block_costs(w, plan)
        self.layers_per_stage = w.layers // plan.num_stages
        self.nodes: list[Node] = []
        self.edges: list[tuple[int, int, str]] = []
        self.last_on_stream: dict[tuple[int, int], int] = {}
        self.pass_end: dict[tuple[str, int, int], int] = {}  # (phase, stage, mb) -> last node of that pass
        self.saved_bytes: dict[tuple[int, int], float] = {}  # (stage, mb) -> activations its forward keeps
        self.costs: dict[tuple, float] = {}  # distinct node -> estimated seconds
        per_node = cluster.devices_per_node
        # mesh order (pp, dp, tp) with tp innermost: a group crosses nodes once its span exceeds a node
        self.tp_cross = plan.tp > per_node
        self.dp_cross = plan.tp * plan.dp > per_node
        self.pp_cross = plan.tp * plan.dp * plan.pp > per_node and plan.pp > 1

    def add(self, node: Node, deps=()) -> int:
        node.est_time = self._estimate(node)
        if node.phase == "forward" and node.alloc_bytes and node.kind != "fsdp_allgather":
            key = (node.stage, node.microbatch)
            self.saved_bytes[key] = self.saved_bytes.get(key, 0.0) + node.alloc_bytes
        idx = len(self.nodes)
        self.nodes.append(node)
        for d in deps:
            if d is not None:
                self.edges.append((d, idx, "data"))
        key = (node.rank, node.stream)
        if key in self.last_on_stream:
            self.edges.append((self.last_on_stream[key], idx, "order"))
        self.last_on_stream[key] = idx
        return idx

    def _estimate(self, n: Node) -> float:
        # every micro-batch repeats the same few nodes: cost each distinct one once (a third of build time)
        key = (n.kind, n.count, n.flops, n.message_bytes, n.group, n.crosses_node)
        cost = self.costs.get(key)
        if cost is None:
            cost = self.costs[key] = self._cost(n)
        return cost

    def _cost(self, n: Node) -> float:
        if n.kind in COMM_KINDS:
            op = COLLECTIVE.get(n.kind) or ("reduce_scatter" if self.plan.sequence_parallel else "all_reduce")
            per_call = self.hw.comm_time(op, n.message_bytes, n.group, n.crosses_node)
            if n.kind == "tp_comm" and self.plan.sequence_parallel:
                per_call += self.hw.comm_time("all_gather", n.message_bytes / n.group, n.group, n.crosses_node)
            return n.count * per_call
        return self.hw.compute_time(n.flops, self.w.dtype)


def build_graph(w: Workload, plan: Plan, cluster: Cluster, hw: HardwareModel) -> ExecGraph:
    b = _Builder(w, plan, cluster, hw)
    orders = rank_orders(plan)
    # Ranks are compiled one after another, so a pass may depend on a pass of a later
    # rank that is not built yet: compile in a global order that respects dependencies.
    for rank, phase, stage, mb in _global_order(orders):
        (_forward if phase == "F" else _backward)(b, rank, stage, mb, first=mb == 0)
    for rank, order in enumerate(orders):
        _step(b, rank, order)
    # a rank holds stages rank, rank + pp, ... (several under interleaving)
    # resident from the start: parameters, optimizer state, DDP's buckets. Gradients are not: the first backward
    # of each stage allocates them (see _backward), after FSDP has resharded what it gathered.
    static = [sum(sum(v for k, v in state_bytes(w, plan, stage_params(w, plan, b.c, s, b.layers_per_stage)).items()
                      if k != "grad") + _fsdp_held_bytes(b, s) for s in range(rank, plan.num_stages, plan.pp))
              for rank in range(plan.pp)]
    return ExecGraph(b.nodes, b.edges, static, plan, w, {"hardware": hw.id})


def _fsdp_held_bytes(b: _Builder, stage: int) -> float:
    """FSDP2 over dp > 1 keeps the last reduce-scatter's buffers, about one unit, from one iteration into the next."""
    return _fsdp_unit_bytes(b, stage) if b.plan.sharding.startswith("fsdp") and b.plan.dp > 1 else 0.0


def _global_order(orders):
    """Interleave the ranks' programs so every pass comes after the passes it needs."""
    done, cursors, out = set(), [0] * len(orders), []
    num_stages = max(s for order in orders for _, s, _ in order) + 1
    while len(out) < sum(map(len, orders)):
        progressed = False
        for rank, order in enumerate(orders):
            while cursors[rank] < len(order):
                phase, stage, mb = order[cursors[rank]]
                need = ("F", stage - 1, mb) if phase == "F" and stage > 0 else (
                    ("B", stage + 1, mb) if phase == "B" and stage < num_stages - 1 else ("F", stage, mb))
                if phase == "F" and stage == 0:
                    need = None
                if need is not None and need not in done:
                    break
                done.add((phase, stage, mb))
                out.append((rank, phase, stage, mb))
                cursors[rank] += 1
                progressed = True
        if not progressed:
            raise ValueError(f"pipeline schedule deadlocks: {[o[c] if c < len(o) else None for o, c in zip(orders, cursors)]}")
    return out


def _forward(b: _Builder, rank: int, stage: int, mb: int, first: bool) -> None:
    plan, c, L = b.plan, b.c, b.layers_per_stage
    deps = [b.pass_end.get(("F", stage - 1, mb))]
    # grad_op keeps parameters gathered across a pipeline's micro-batches; without pp the
    # trainer reshards after each backward, so every micro-batch gathers again.
    if plan.sharding == "fsdp_full" or (plan.sharding == "fsdp_grad_op" and (first or plan.pp == 1)):
        gather = _fsdp_gather(b, rank, stage, mb, "forward")
        deps = [b.add(gather, deps)]
        if plan.sharding == "fsdp_grad_op":  # kept gathered until the backward that reshards: see _fsdp_gather
            last = mb if plan.pp == 1 else plan.num_microbatches - 1
            b.saved_bytes[(stage, last)] = b.saved_bytes.get((stage, last), 0.0) + gather.alloc_bytes
    if stage == 0:
        deps = [b.add(Node("embed", "forward", rank, stage, mb, flops=0.0, alloc_bytes=c.boundary_bytes), deps)]
    saved = saved_bytes_per_layer(c, plan)
    for kind, flops in (("attn", c.attn_flops), ("mlp", c.mlp_flops)):
        deps = [b.add(Node(kind, "forward", rank, stage, mb, count=L, flops=L * flops,
                           alloc_bytes=L * saved / 2), deps)]
        if plan.tp > 1:
            deps = [b.add(_tp_comm(b, rank, stage, mb, "forward"), deps)]
    if stage == plan.num_stages - 1:
        deps = [b.add(Node("head", "forward", rank, stage, mb, flops=c.head_flops,
                           alloc_bytes=c.logits_bytes, transient_bytes=2 * c.logits_bytes), deps)]
    else:
        deps = [b.add(Node("p2p", "forward", rank, stage, mb, message_bytes=c.boundary_bytes, group=2,
                           crosses_node=b.pp_cross), deps)]
    b.pass_end[("F", stage, mb)] = deps[0]


def _backward(b: _Builder, rank: int, stage: int, mb: int, first: bool) -> None:
    plan, c, L = b.plan, b.c, b.layers_per_stage
    last_stage = stage == plan.num_stages - 1
    deps = [b.pass_end[("F", stage, mb)], None if last_stage else b.pass_end.get(("B", stage + 1, mb))]
    params = stage_params(b.w, plan, c, stage, L)
    grads = state_bytes(b.w, plan, params)["grad"] if mb == 0 else 0.0  # accumulated in place after the first
    if plan.sharding == "fsdp_full":
        gather = _fsdp_gather(b, rank, stage, mb, "backward")
        # FSDP2 writes each unit's gradient shards as its backward ends, while it gathers the next units: the
        # peak comes late in the backward, with most shards written. Charged here, where the gathers start.
        gather.alloc_bytes, grads = grads, 0.0
        deps = [b.add(gather, deps)]
    if plan.recompute != "none":
        share = 1.0 if plan.recompute == "full" else 0.1  # selective recomputes only cheap pointwise ops
        deps = [b.add(Node("attn", "recompute", rank, stage, mb, count=L, flops=share * L * (c.attn_flops + c.mlp_flops),
                           transient_bytes=c.activation_bytes_per_layer), deps)]
    if last_stage:
        deps = [b.add(Node("head", "backward", rank, stage, mb, flops=2 * c.head_flops,
                           transient_bytes=c.logits_bytes), deps)]
    for kind, flops in (("mlp", c.mlp_flops), ("attn", c.attn_flops)):
        if plan.tp > 1:
            deps = [b.add(_tp_comm(b, rank, stage, mb, "backward"), deps)]
        deps = [b.add(Node(kind, "backward", rank, stage, mb, count=L, flops=2 * L * flops), deps)]
    if stage == 0:
        deps = [b.add(Node("embed", "backward", rank, stage, mb), deps)]
    end = b.nodes[deps[0]]
    end.free_bytes = b.saved_bytes.get((stage, mb), 0.0)
    if plan.sharding.startswith("fsdp") and plan.dp > 1:
        # a unit's unsharded gradients and the reduce-scatter's input copy of them are live together
        b.add(Node("fsdp_reducescatter", "backward", rank, stage, mb, message_bytes=params * dtype_bytes(b.w),
                   group=plan.dp, crosses_node=b.dp_cross, transient_bytes=2 * _fsdp_unit_bytes(b, stage),
                   alloc_bytes=grads), deps)
    else:
        end.alloc_bytes += grads
    if stage > 0:
        deps = [b.add(Node("p2p", "backward", rank, stage, mb, message_bytes=c.boundary_bytes, group=2,
                           crosses_node=b.pp_cross), deps)]
    b.pass_end[("B", stage, mb)] = deps[0]


def _fsdp_unit_bytes(b: _Builder, stage: int) -> float:
    """Unsharded bytes of one FSDP unit (a block: the trainer shards block by block), the stage's average."""
    return stage_params(b.w, b.plan, b.c, stage, b.layers_per_stage) * dtype_bytes(b.w) / max(b.layers_per_stage, 1)


def _fsdp_gather(b: _Builder, rank: int, stage: int, mb: int, phase: str) -> Node:
    """FSDP2's all-gather of a stage's blocks, one unit at a time (measured on gloo ranks, torch 2.13).

    fsdp_full frees each unit after its forward; its backward gathers the next unit while the current one
    runs (backward prefetch), so two units are live. fsdp_grad_op keeps every unit gathered from its forward
    to its backward: the whole stage, allocated here and freed by the backward that reshards (the builder
    records when).
    """
    full = stage_params(b.w, b.plan, b.c, stage, b.layers_per_stage) * dtype_bytes(b.w)
    unit = _fsdp_unit_bytes(b, stage)
    keep = b.plan.sharding == "fsdp_grad_op" and phase == "forward"
    prefetch = 2 if phase == "backward" and b.plan.dp > 1 else 1
    return Node("fsdp_allgather", phase, rank, stage, mb, message_bytes=full / b.plan.dp, group=b.plan.dp,
                crosses_node=b.dp_cross, alloc_bytes=full if keep else 0.0,
                transient_bytes=0.0 if keep else prefetch * unit)


def _tp_comm(b: _Builder, rank: int, stage: int, mb: int, phase: str) -> Node:
    return Node("tp_comm", phase, rank, stage, mb, count=b.layers_per_stage, message_bytes=b.c.boundary_bytes,
                group=b.plan.tp, crosses_node=b.tp_cross)


def _step(b: _Builder, rank: int, order) -> None:
    plan, w = b.plan, b.w
    stages = sorted({s for _, s, _ in order})
    deps = [b.pass_end[("B", s, max(m for p, st, m in order if st == s and p == "B"))] for s in stages]
    params = sum(stage_params(w, plan, b.c, s, b.layers_per_stage) for s in stages)
    if plan.dp > 1 and not plan.sharding.startswith("fsdp"):
        grad_bytes = params * dtype_bytes(w)
        buckets = max(1, int(np.ceil(grad_bytes / DDP_BUCKET_BYTES)))
        deps = [b.add(Node("dp_comm", "backward", rank, stages[0], -1, count=buckets,
                           message_bytes=grad_bytes / buckets, group=plan.dp, crosses_node=b.dp_cross), deps)]
    shard = plan.dp if plan.sharding != "none" else 1
    # AdamW reads and writes parameter, gradient and both moments: ~16 bytes and ~10 flops per parameter. On CPU
    # it updates one tensor at a time (no foreach kernels), with two temporaries the size of that tensor: the
    # largest tensor sets the peak (measured: 2.1 MB over the states for a 1.05 MB MLP weight).
    step = b.add(Node("optimizer", "step", rank, stages[0], -1, flops=10 * params / shard,
                      transient_bytes=2 * largest_param(w, plan, stages) * dtype_bytes(w)), deps)
    if plan.sharding == "zero1" and plan.dp > 1:
        b.add(Node("zero_allgather", "step", rank, stages[0], -1, message_bytes=params * dtype_bytes(w) / plan.dp,
                   group=plan.dp, crosses_node=b.dp_cross), [step])
