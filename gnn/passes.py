"""The nodes of one forward or backward pass of a stage, and of a rank's optimizer step, as table rows.

Every micro-batch of a stage runs the same pass: the same blocks, collectives, costs and memory. Only the
first and last micro-batches differ (the first backward allocates the gradients; FSDP gathers and frees on
the first and last), so a plan has a handful of distinct passes, and gnn.graph repeats their rows across
the schedule. Rows are built for one stage of a role (first, middle, last) with rank and micro-batch 0;
gnn.graph fills in all three where it places a pass. Nothing here depends on the micro-batch count or the
pipeline schedule (gnn.layout places the passes), so the two short graphs of a truncated plan (gnn.truncate)
share one compiler, and so can the plans of a batch that differ only in those (``shared_compiler``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collect.schema import Cluster, Plan, Workload
from gnn.costs import (BlockCosts, block_costs, dtype_bytes, largest_param, saved_bytes_per_layer, stage_params,
                       state_bytes)
from gnn.graph import COL, COLUMNS, COMM_KINDS, KINDS, Node
from gnn.hardware_model import HardwareModel

COLLECTIVE = {"dp_comm": "all_reduce", "fsdp_allgather": "all_gather", "fsdp_reducescatter": "reduce_scatter",
              "zero_allgather": "all_gather", "p2p": "send_recv"}  # tp_comm depends on sequence parallelism
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb
_GATHER = KINDS.index("fsdp_allgather")


@dataclass
class PassTemplate:
    table: np.ndarray  # [nodes, COLUMNS]
    edges: np.ndarray  # [2, k] data dependencies inside the pass, local indices
    end: int  # local index of the node that ends the pass (what later passes depend on)
    grads_at: int = -1  # a backward: the node that allocates the gradients when it is a stage's first

    def __post_init__(self):
        # what placing the pass depends on (gnn.graph caches the placement by it): its size, its nodes' streams
        # and its edges, not its costs
        self.shape = (len(self.table), self.table[:, COL["stream"]].tobytes(), self.edges.tobytes(), self.end)


class _Rows:
    """Nodes of one pass in order, with their data dependencies; the first node takes the pass's outside ones."""

    def __init__(self, compiler: "PassCompiler"):
        self.compiler, self.nodes, self.edges = compiler, [], []

    def add(self, node: Node, after: int | None) -> int:
        node.est_time = self.compiler.estimate(node)
        self.nodes.append(node)
        if after is not None:
            self.edges.append((after, len(self.nodes) - 1))
        return len(self.nodes) - 1

    def done(self, end: int, grads_at: int = -1) -> PassTemplate:
        table = np.array([n.row() for n in self.nodes], dtype=np.float64).reshape(-1, len(COLUMNS))
        return PassTemplate(table, np.array(self.edges, dtype=np.int64).reshape(-1, 2).T.copy(), end, grads_at)


def shared_compiler(cache: dict | None, w: Workload, plan: Plan, cluster: Cluster, hw: HardwareModel) -> "PassCompiler":
    """A compiler for the plan, taken from ``cache`` (the caller's, for one batch of plans) when an earlier plan
    differed only in schedule and micro-batch count. The cache holds references to ``hw``: scope it to a batch."""
    if cache is None:
        return PassCompiler(w, plan, cluster, hw)
    key = (w, cluster, id(hw), plan.dp, plan.tp, plan.pp, plan.virtual_stages, plan.sharding, plan.recompute,
           plan.sequence_parallel)
    found = cache.get(key)
    if found is None or found.hw is not hw:
        found = cache[key] = PassCompiler(w, plan, cluster, hw, cache.setdefault(_SHARED, {}))
    return found


_SHARED = ("templates",)  # the key, in a shared_compiler cache, of the templates its compilers share


class PassCompiler:
    def __init__(self, w: Workload, plan: Plan, cluster: Cluster, hw: HardwareModel, shared: dict | None = None):
        """``shared``: templates shared with the other compilers of a batch, by what their rows depend on
        (``template``, ``step``)."""
        self.w, self.plan, self.hw = w, plan, hw
        self.c: BlockCosts = block_costs(w, plan)
        self.num_stages = plan.num_stages  # a computed property of the plan: read once, it is read per pass
        self.layers_per_stage = w.layers // self.num_stages
        self.costs: dict[tuple, float] = {}  # distinct node -> estimated seconds
        self.templates: dict[tuple, PassTemplate] = {}
        self.shared = {} if shared is None else shared
        # what a forward or backward pass depends on besides its stage role, variant and FSDP (see template)
        self._passes_key = (id(hw), w, cluster, plan.dp, plan.tp, plan.pp, plan.virtual_stages, plan.recompute,
                            plan.sequence_parallel)
        self._static: list[float] | None = None
        self.activations: dict[tuple[bool, bool], float] = {}  # per stage role (first?, last?)
        per_node = cluster.devices_per_node
        # mesh order (pp, dp, tp) with tp innermost: a group crosses nodes once its span exceeds a node
        self.tp_cross = plan.tp > per_node
        self.dp_cross = plan.tp * plan.dp > per_node
        self.pp_cross = plan.tp * plan.dp * plan.pp > per_node and plan.pp > 1

    def template(self, phase: str, stage: int, variant: tuple[bool, ...]) -> PassTemplate:
        """A forward or backward pass (variants: gnn.layout.variant). Stages in the middle of the pipeline hold
        the same blocks, so one template serves every stage of a role (first, middle, last), and plans of a batch
        that agree on all the pass reads of them (``_sharding_read``) share it."""
        key = (phase, stage == 0, stage == self.num_stages - 1, *variant)
        found = self.templates.get(key)
        if found is None:
            if phase == "B" and variant[0]:  # a stage's first backward: per plan, it charges the gradients
                found = self._backward(stage, *variant)
            else:
                shared_key = (self._passes_key, key, self._sharding_read(phase, variant))
                found = self.shared.get(shared_key)
                if found is None:
                    found = self.shared[shared_key] = (self._forward if phase == "F" else self._backward)(stage, *variant)
            self.templates[key] = found
        return found

    def _sharding_read(self, phase: str, variant: tuple[bool, ...]):
        """What a forward or (not first) backward pass reads of the plan's sharding: a forward, only which FSDP
        mode gathers for it, if it gathers; a backward, whether FSDP fully shards (it gathers, and charges the
        gradients there) and whether it reduce-scatters."""
        plan = self.plan
        if phase == "F":
            return plan.sharding if variant[0] else None
        return plan.sharding == "fsdp_full", plan.sharding.startswith("fsdp") and plan.dp > 1

    # --- the passes ----------------------------------------------------------------------------------------

    def _forward(self, stage: int, gathers: bool) -> PassTemplate:
        plan, c, L = self.plan, self.c, self.layers_per_stage
        rows, last = _Rows(self), None
        if gathers:
            last = rows.add(self._fsdp_gather(stage, "forward"), last)
        if stage == 0:
            last = rows.add(Node("embed", "forward", 0, stage, 0, flops=0.0, alloc_bytes=c.boundary_bytes), last)
        saved = saved_bytes_per_layer(c, plan)
        for kind, flops in (("attn", c.attn_flops), ("mlp", c.mlp_flops)):
            last = rows.add(Node(kind, "forward", 0, stage, 0, count=L, flops=L * flops, alloc_bytes=L * saved / 2), last)
            if plan.tp > 1:
                last = rows.add(self._tp_comm(stage, "forward"), last)
        if stage == plan.num_stages - 1:
            last = rows.add(Node("head", "forward", 0, stage, 0, flops=c.head_flops, alloc_bytes=c.logits_bytes,
                                 transient_bytes=2 * c.logits_bytes), last)
        else:
            last = rows.add(Node("p2p", "forward", 0, stage, 0, message_bytes=c.boundary_bytes, group=2,
                                 crosses_node=self.pp_cross), last)
        return rows.done(last)

    def _saved_bytes(self, stage: int, frees_gather: bool) -> float:
        """What a forward of the stage keeps for its backward: activations, and under grad_op the parameters
        gathered for the micro-batches up to the backward that reshards."""
        return self._activations(stage) + (self._stage_bytes(stage) if frees_gather else 0.0)

    def _activations(self, stage: int) -> float:
        """The activations a forward of the stage saves, whichever variant: only the FSDP gather differs."""
        role = (stage == 0, stage == self.num_stages - 1)
        found = self.activations.get(role)
        if found is None:
            forward = self.templates.get(("F", *role, True)) or self.template("F", stage, (False,))
            table = forward.table
            found = self.activations[role] = float(table[table[:, COL["kind"]] != _GATHER, COL["alloc_bytes"]].sum())
        return found

    def _backward(self, stage: int, first: bool, frees_gather: bool) -> PassTemplate:
        if first:
            # a stage's first backward is any other plus the gradients it allocates (accumulated in place after)
            other = self.template("B", stage, (False, frees_gather))
            table = other.table.copy()
            table[other.grads_at, COL["alloc_bytes"]] += state_bytes(self.w, self.plan, self._params(stage))["grad"]
            return PassTemplate(table, other.edges, other.end, other.grads_at)
        plan, c, L = self.plan, self.c, self.layers_per_stage
        last_stage = stage == plan.num_stages - 1
        rows, last = _Rows(self), None
        if plan.sharding == "fsdp_full":
            # FSDP2 writes each unit's gradient shards as its backward ends, while it gathers the next units: the
            # peak comes late in the backward, with most shards written. Charged here, where the gathers start.
            last = grads_at = rows.add(self._fsdp_gather(stage, "backward"), last)
        if plan.recompute != "none":
            share = 1.0 if plan.recompute == "full" else 0.1  # selective recomputes only cheap pointwise ops
            last = rows.add(Node("attn", "recompute", 0, stage, 0, count=L, flops=share * L * (c.attn_flops + c.mlp_flops),
                                 transient_bytes=c.activation_bytes_per_layer), last)
        if last_stage:
            last = rows.add(Node("head", "backward", 0, stage, 0, flops=2 * c.head_flops,
                                 transient_bytes=c.logits_bytes), last)
        for kind, flops in (("mlp", c.mlp_flops), ("attn", c.attn_flops)):
            if plan.tp > 1:
                last = rows.add(self._tp_comm(stage, "backward"), last)
            last = rows.add(Node(kind, "backward", 0, stage, 0, count=L, flops=2 * L * flops), last)
        if stage == 0:
            last = rows.add(Node("embed", "backward", 0, stage, 0), last)
        rows.nodes[last].free_bytes = self._saved_bytes(stage, frees_gather)
        if plan.sharding.startswith("fsdp") and plan.dp > 1:
            # a unit's unsharded gradients and the reduce-scatter's input copy of them are live together
            scatter = rows.add(Node("fsdp_reducescatter", "backward", 0, stage, 0,
                                    message_bytes=self._params(stage) * dtype_bytes(self.w), group=plan.dp,
                                    crosses_node=self.dp_cross, transient_bytes=2 * self._unit_bytes(stage)), last)
            if plan.sharding != "fsdp_full":
                grads_at = scatter
        elif plan.sharding != "fsdp_full":
            grads_at = last
        if stage > 0:
            last = rows.add(Node("p2p", "backward", 0, stage, 0, message_bytes=c.boundary_bytes, group=2,
                                 crosses_node=self.pp_cross), last)
        return rows.done(last, grads_at)

    def step(self, stages: tuple[int, ...]) -> PassTemplate:
        """A rank's end of iteration: DDP's gradient all-reduce, the optimizer, ZeRO-1's parameter all-gather.
        Its rows depend on the parameters held, how they are sharded and reduced, and the hardware, not on the
        schedule, micro-batches or recompute: plans of a batch that agree on those share it, as do ranks whose
        stages have the same roles (gnn.graph writes each rank's own stage into the rows it places)."""
        plan = self.plan
        key = ("S", id(self.hw), self.w, plan.tp, plan.dp, plan.sharding, self.layers_per_stage, self.dp_cross,
               tuple((s == 0, s == self.num_stages - 1) for s in stages))
        found = self.shared.get(key)
        if found is None:
            found = self.shared[key] = self._step(stages)
        return found

    def _step(self, stages: tuple[int, ...]) -> PassTemplate:
        plan, w = self.plan, self.w
        rows, last = _Rows(self), None
        params = sum(self._params(s) for s in stages)
        if plan.dp > 1 and not plan.sharding.startswith("fsdp"):
            grad_bytes = params * dtype_bytes(w)
            buckets = max(1, int(np.ceil(grad_bytes / DDP_BUCKET_BYTES)))
            last = rows.add(Node("dp_comm", "backward", 0, stages[0], -1, count=buckets,
                                 message_bytes=grad_bytes / buckets, group=plan.dp, crosses_node=self.dp_cross), last)
        shard = plan.dp if plan.sharding != "none" else 1
        # AdamW reads and writes parameter, gradient and both moments: ~16 bytes and ~10 flops per parameter. On
        # CPU it updates one tensor at a time (no foreach kernels), with two temporaries the size of that tensor:
        # the largest tensor sets the peak (measured: 2.1 MB over the states for a 1.05 MB MLP weight).
        last = step = rows.add(Node("optimizer", "step", 0, stages[0], -1, flops=10 * params / shard,
                                    transient_bytes=2 * largest_param(w, plan, stages) * dtype_bytes(w)), last)
        if plan.sharding == "zero1" and plan.dp > 1:
            rows.add(Node("zero_allgather", "step", 0, stages[0], -1, message_bytes=params * dtype_bytes(w) / plan.dp,
                          group=plan.dp, crosses_node=self.dp_cross), step)
        return rows.done(last)

    def static_bytes(self) -> list[float]:
        """Resident from the start, per pipeline rank (holding stages rank, rank + pp, ...): parameters, optimizer
        state, DDP's buckets. Gradients are not: the first backward of each stage allocates them (see _backward),
        after FSDP has resharded what it gathered."""
        if self._static is None:
            self._static = self._static_bytes()
        return list(self._static)

    def _static_bytes(self) -> list[float]:
        plan = self.plan
        return [sum(sum(v for k, v in state_bytes(self.w, plan, self._params(s)).items() if k != "grad")
                    + self._fsdp_held_bytes(s) for s in range(rank, plan.num_stages, plan.pp))
                for rank in range(plan.pp)]

    # --- pieces --------------------------------------------------------------------------------------------

    def _params(self, stage: int) -> float:
        return stage_params(self.w, self.plan, self.c, stage, self.layers_per_stage)

    def _stage_bytes(self, stage: int) -> float:
        return self._params(stage) * dtype_bytes(self.w)

    def _unit_bytes(self, stage: int) -> float:
        """Unsharded bytes of one FSDP unit (a block: the trainer shards block by block), the stage's average."""
        return self._stage_bytes(stage) / max(self.layers_per_stage, 1)

    def _fsdp_held_bytes(self, stage: int) -> float:
        """FSDP2 over dp > 1 keeps the last reduce-scatter's buffers, about one unit, from one iteration into the
        next."""
        return self._unit_bytes(stage) if self.plan.sharding.startswith("fsdp") and self.plan.dp > 1 else 0.0

    def _fsdp_gather(self, stage: int, phase: str) -> Node:
        """FSDP2's all-gather of a stage's blocks, one unit at a time (measured on gloo ranks, torch 2.13).

        fsdp_full frees each unit after its forward; its backward gathers the next unit while the current one
        runs (backward prefetch), so two units are live. fsdp_grad_op keeps every unit gathered from its forward
        to its backward: the whole stage, allocated here and freed by the backward that reshards
        (gnn.layout.variant says which).
        """
        full, plan = self._stage_bytes(stage), self.plan
        keep = plan.sharding == "fsdp_grad_op" and phase == "forward"
        prefetch = 2 if phase == "backward" and plan.dp > 1 else 1
        return Node("fsdp_allgather", phase, 0, stage, 0, message_bytes=full / plan.dp, group=plan.dp,
                    crosses_node=self.dp_cross, alloc_bytes=full if keep else 0.0,
                    transient_bytes=0.0 if keep else prefetch * self._unit_bytes(stage))

    def _tp_comm(self, stage: int, phase: str) -> Node:
        return Node("tp_comm", phase, 0, stage, 0, count=self.layers_per_stage, message_bytes=self.c.boundary_bytes,
                    group=self.plan.tp, crosses_node=self.tp_cross)

    def estimate(self, n: Node) -> float:
        # the same node recurs across stages and passes: cost each distinct one once
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

