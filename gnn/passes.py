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
from gnn.costs import (BlockCosts, block_costs, block_features, dtype_bytes, largest_param, saved_bytes_per_layer,
                       stage_params, state_bytes)
from gnn.graph import COL, COLUMNS, COMM_KINDS, KINDS, table_row
from gnn.hardware_model import HardwareModel

COLLECTIVE = {"dp_comm": "all_reduce", "fsdp_allgather": "all_gather", "fsdp_reducescatter": "reduce_scatter",
              "zero_allgather": "all_gather", "p2p": "send_recv"}  # tp_comm depends on sequence parallelism
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb
# parameter tensors of one GPT layer: two norms (weight, bias) and six linears (weight, bias); the first stage
# adds 2 (token and position embeddings), the last 3 (the final norm's two, the output projection)
TENSORS_PER_LAYER = 16
_GATHER = KINDS.index("fsdp_allgather")


@dataclass
class PassTemplate:
    table: np.ndarray  # [nodes, COLUMNS]
    edges: np.ndarray  # [2, k] data dependencies inside the pass, local indices
    end: int  # local index of the node that ends the pass (what later passes depend on)
    grads_at: int = -1  # a backward: the node that allocates the gradients when it is a stage's first
    kept_bytes: float = 0.0  # what its nodes allocate and keep, FSDP's gathers aside: a forward's activations
    # what placing the pass depends on (gnn.graph caches the placement by it): its size, its nodes' streams and
    # its edges, not its costs. Computed unless given (a copy with other costs has its original's).
    shape: tuple | None = None

    def __post_init__(self):
        if self.shape is None:
            self.shape = (len(self.table), self.table[:, COL["stream"]].tobytes(), self.edges.tobytes(), self.end)


class _Rows:
    """Rows of one pass in order, with their data dependencies; the first row takes the pass's outside ones.
    Rows are lists in COLUMNS order (rank and micro-batch 0: gnn.graph writes where each pass is placed), not
    Node objects: a plan compiles ~5 passes of ~5 rows, and an object per row cost a fifth of featurising."""

    def __init__(self, compiler: "PassCompiler"):
        self.compiler, self.rows, self.sources, self.targets = compiler, [], [], []
        self.held = 0.0  # bytes the pass allocates for the rest of the iteration, not for its backward to free

    def add(self, after: int | None, kind: str, phase: str, stage: int, *, count: int = 1, flops: float = 0.0,
            message_bytes: float = 0.0, group: int = 1, crosses_node: bool = False, alloc_bytes: float = 0.0,
            transient_bytes: float = 0.0, seconds: float | None = None) -> int:
        """A node after node ``after`` (None: the pass's first); returns its index. Fields as gnn.graph.Node;
        ``seconds``: its cost, when the caller prices it (otherwise the compiler's estimate)."""
        est = seconds if seconds is not None else self.compiler.estimate(kind, phase, count, flops, message_bytes,
                                                                         group, crosses_node)
        self.rows.append(table_row(kind, phase, 0, stage, 0, count, flops, message_bytes, group, crosses_node,
                                   alloc_bytes, 0.0, transient_bytes, est))
        if after is not None:
            self.sources.append(after)
            self.targets.append(len(self.rows) - 1)
        return len(self.rows) - 1

    def set(self, index: int, column: str, value: float) -> None:
        self.rows[index][COL[column]] = value

    def hold(self, index: int, nbytes: float) -> None:
        """Row ``index`` also allocates ``nbytes`` that stay live to the end of the iteration."""
        self.rows[index][COL["alloc_bytes"]] += nbytes
        self.held += nbytes

    def done(self, end: int, grads_at: int = -1) -> PassTemplate:
        table = np.array(self.rows, dtype=np.float64).reshape(-1, len(COLUMNS))
        kind, alloc = COL["kind"], COL["alloc_bytes"]
        kept = sum(row[alloc] for row in self.rows if row[kind] != _GATHER) - self.held
        return PassTemplate(table, np.array([self.sources, self.targets], dtype=np.int64), end, grads_at, float(kept))


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
        self.gloo = cluster.backend == "gloo"
        self.c: BlockCosts = block_costs(w, plan)
        self.num_stages = plan.num_stages  # a computed property of the plan: read once, it is read per pass
        self.layers_per_stage = w.layers // self.num_stages
        self.costs: dict[tuple, float] = {}  # distinct node -> estimated seconds
        self.templates: dict[tuple, PassTemplate] = {}
        self.shared = {} if shared is None else shared
        # the shared passes and steps of plans that agree on what this one's depend on besides their stage roles,
        # variants and sharding (see template, step): looked up once here, as the key holds the workload and
        # cluster, whose hashes and comparisons are costly
        self._shared_passes = self.shared.setdefault((id(hw), w, cluster, plan.dp, plan.tp, plan.pp,
                                                      plan.virtual_stages, plan.recompute, plan.sequence_parallel), {})
        self._shared_steps = self.shared.setdefault(("S", id(hw), w), {})
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
                shared_key = (key, self._sharding_read(phase, variant))
                found = self._shared_passes.get(shared_key)
                if found is None:
                    found = self._shared_passes[shared_key] = (self._forward if phase == "F" else self._backward)(stage, *variant)
            self.templates[key] = found
        return found

    def _sharding_read(self, phase: str, variant: tuple[bool, ...]):
        """What a forward or (not first) backward pass reads of the plan's sharding: a forward, only which FSDP
        mode gathers for it, if it gathers; a backward, whether FSDP fully shards (it gathers, and charges the
        gradients there) and whether it reduce-scatters; both, with a block profile, which FSDP mode wraps the
        layers (its hooks cost time whether or not the pass gathers)."""
        plan = self.plan
        fsdp = plan.sharding.startswith("fsdp")
        wrapper = plan.sharding if fsdp and self.hw.blocks is not None else None  # its hooks' cost (block profile)
        if phase == "F":
            return plan.sharding if variant[0] else None, wrapper
        return plan.sharding == "fsdp_full", fsdp and plan.dp > 1, wrapper

    # --- the passes ----------------------------------------------------------------------------------------

    def _forward(self, stage: int, gathers: bool) -> PassTemplate:
        plan, c, L = self.plan, self.c, self.layers_per_stage
        rows, last = _Rows(self), None
        if gathers:
            last = self._fsdp_gather(rows, last, stage, "forward")
        if stage == 0:
            last = rows.add(last, "embed", "forward", stage, alloc_bytes=c.boundary_bytes)
        saved = saved_bytes_per_layer(c, plan)
        for kind, flops in (("attn", c.attn_flops), ("mlp", c.mlp_flops)):
            last = rows.add(last, kind, "forward", stage, count=L, flops=L * flops, alloc_bytes=L * saved / 2)
            if stage > 0 and kind == "attn":
                rows.hold(last, c.boundary_bytes)  # pipelining's receive buffer for this micro-batch's input
            if plan.tp > 1:
                last = self._tp_comm(rows, last, stage, "forward")
        if stage == plan.num_stages - 1:
            last = rows.add(last, "head", "forward", stage, flops=c.head_flops, alloc_bytes=c.logits_bytes,
                            transient_bytes=2 * c.logits_bytes)
            if plan.pp > 1:
                rows.hold(last, c.logits_bytes * dtype_bytes(self.w) / 4)  # the schedule keeps each output
        else:
            last = rows.add(last, "p2p", "forward", stage, message_bytes=c.boundary_bytes, group=2,
                            crosses_node=self.pp_cross)
        return rows.done(last)

    def _pipelined_fsdp(self) -> bool:
        """FSDP over dp > 1 inside torch.distributed.pipelining: its stages turn off FSDP's gradient sync and
        its resharding after backward for every micro-batch, and reduce-scatter once, after the last."""
        plan = self.plan
        return plan.pp > 1 and plan.dp > 1 and plan.sharding.startswith("fsdp")

    def _grad_bytes(self, stage: int) -> float:
        """The gradients a stage's first backward allocates: unsharded while pipelining defers FSDP's sync."""
        grads = state_bytes(self.w, self.plan, self._params(stage))["grad"]
        return grads * self.plan.dp if self._pipelined_fsdp() else grads

    def _grads_written_at_gather(self, stage: int) -> float:
        """Share of a stage's gradients a first backward has allocated at its peak. Under fsdp_full over dp > 1
        the peak comes while the last two units are gathered: the gradient shards of the units before them
        are written, those of these two and of the root unit (embedding, head: reduced at the very end) not
        yet (allocator trace, one micro-batch: 2 of 4 block shards live at the peak). Otherwise all of them."""
        if self.plan.sharding != "fsdp_full" or self.plan.dp == 1:
            return 1.0
        L, c = self.layers_per_stage, self.c
        return max(L - 2, 0) * c.layer_params / self._params(stage)

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
            found = self.activations[role] = forward.kept_bytes
        return found

    def _backward(self, stage: int, first: bool, frees_gather: bool) -> PassTemplate:
        if first:
            # a stage's first backward is any other plus the gradients it allocates (accumulated in place after)
            other = self.template("B", stage, (False, frees_gather))
            table = other.table.copy()
            grads = self._grad_bytes(stage)
            early = grads * self._grads_written_at_gather(stage)
            table[other.grads_at, COL["alloc_bytes"]] += early
            table[other.end, COL["alloc_bytes"]] += grads - early
            return PassTemplate(table, other.edges, other.end, other.grads_at, other.kept_bytes, other.shape)
        plan, c, L = self.plan, self.c, self.layers_per_stage
        last_stage = stage == plan.num_stages - 1
        rows, last = _Rows(self), None
        if plan.sharding == "fsdp_full":
            # FSDP2 writes each unit's gradient shards as its backward ends, while it gathers the next units: the
            # peak comes late in the backward, with most shards written. Charged here, where the gathers start.
            last = grads_at = self._fsdp_gather(rows, last, stage, "backward")
        if plan.recompute != "none":
            share = 1.0 if plan.recompute == "full" else 0.1  # selective recomputes only cheap pointwise ops
            last = rows.add(last, "attn", "recompute", stage, count=L, flops=share * L * (c.attn_flops + c.mlp_flops),
                            transient_bytes=c.activation_bytes_per_layer)
        if last_stage:
            last = rows.add(last, "head", "backward", stage, flops=2 * c.head_flops, transient_bytes=c.logits_bytes)
        for kind, flops in (("mlp", c.mlp_flops), ("attn", c.attn_flops)):
            if plan.tp > 1:
                last = self._tp_comm(rows, last, stage, "backward")
            last = rows.add(last, kind, "backward", stage, count=L, flops=2 * L * flops)
        if stage == 0:
            last = rows.add(last, "embed", "backward", stage)
        rows.set(last, "free_bytes", self._saved_bytes(stage, frees_gather))
        # pipelining keeps, per micro-batch, the gradient received from the next stage and the one computed for
        # the previous stage's input (its receive buffer's .grad) until the iteration ends
        rows.hold(last, c.boundary_bytes * ((stage < plan.num_stages - 1) + (stage > 0)))
        if plan.sharding.startswith("fsdp") and plan.dp > 1 and not self._pipelined_fsdp():
            # a unit's unsharded gradients and the reduce-scatter's input copy of them are live together
            units = self._fsdp_units(stage)
            scatter = rows.add(last, "fsdp_reducescatter", "backward", stage, count=units,
                               message_bytes=self._stage_bytes(stage) / units, group=plan.dp,
                               crosses_node=self.dp_cross, transient_bytes=2 * self._unit_bytes(stage))
            if plan.sharding != "fsdp_full":
                grads_at = scatter
        elif plan.sharding != "fsdp_full":
            grads_at = last
        if stage > 0:
            last = rows.add(last, "p2p", "backward", stage, message_bytes=c.boundary_bytes, group=2,
                            crosses_node=self.pp_cross)
        return rows.done(last, grads_at)

    def step(self, stages: tuple[int, ...]) -> PassTemplate:
        """A rank's end of iteration: DDP's gradient all-reduce, the optimizer, ZeRO-1's parameter all-gather.
        Its rows depend on the parameters held, how they are sharded and reduced, and the hardware, not on the
        schedule, micro-batches or recompute: plans of a batch that agree on those share it, as do ranks whose
        stages have the same roles (gnn.graph writes each rank's own stage into the rows it places)."""
        plan = self.plan
        key = (plan.tp, plan.dp, plan.pp, plan.sharding, self.layers_per_stage, self.dp_cross,
               tuple((s == 0, s == self.num_stages - 1) for s in stages))
        found = self._shared_steps.get(key)
        if found is None:
            found = self._shared_steps[key] = self._step(stages)
        return found

    def _step(self, stages: tuple[int, ...]) -> PassTemplate:
        plan, w = self.plan, self.w
        rows, last = _Rows(self), None
        params = sum(self._params(s) for s in stages)
        if plan.dp > 1 and not plan.sharding.startswith("fsdp"):
            grad_bytes = params * dtype_bytes(w)
            buckets = max(1, int(np.ceil(grad_bytes / DDP_BUCKET_BYTES)))
            last = rows.add(last, "dp_comm", "backward", stages[0], count=buckets,
                            message_bytes=grad_bytes / buckets, group=plan.dp, crosses_node=self.dp_cross)
        if self._pipelined_fsdp():
            # one reduce-scatter of the stages' accumulated gradients, unit by unit: a unit's input copy and its
            # shard live beside the unsharded gradients
            unit = max(self._unit_bytes(s) for s in stages)
            units = sum(self._fsdp_units(s) for s in stages)
            last = rows.add(last, "fsdp_reducescatter", "backward", stages[0], count=units,
                            message_bytes=params * dtype_bytes(w) / units, group=plan.dp,
                            crosses_node=self.dp_cross, transient_bytes=unit * (1 + 1 / plan.dp))
        shard = plan.dp if plan.sharding != "none" else 1
        # AdamW reads and writes parameter, gradient and both moments: ~16 bytes and ~10 flops per parameter. On
        # CPU it updates one tensor at a time (no foreach kernels), with two temporaries the size of that tensor:
        # the largest tensor sets the peak (measured: 2.1 MB over the states for a 1.05 MB MLP weight).
        last = step = rows.add(last, "optimizer", "step", stages[0], flops=10 * params / shard,
                               transient_bytes=2 * largest_param(w, plan, stages) * dtype_bytes(w),
                               seconds=self._optimizer_seconds(stages, params / shard))
        if plan.sharding == "zero1" and plan.dp > 1:
            rows.add(step, "zero_allgather", "step", stages[0], message_bytes=params * dtype_bytes(w) / plan.dp,
                     group=plan.dp, crosses_node=self.dp_cross)
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

    def _fsdp_units(self, stage: int) -> int:
        """FSDP2 units of a stage, each gathered and reduce-scattered by its own collective: every block, and the
        stage's root when it holds parameters of its own (embeddings on the first stage, norm and head on the last)."""
        return self.layers_per_stage + (stage == 0 or stage == self.num_stages - 1)

    def _fsdp_held_bytes(self, stage: int) -> float:
        """FSDP2 keeps its last gradient reduction's buffers, about one unit, from one iteration into the next
        (at dp = 1 too: a second unit-sized block beside the last unit's gradients in the allocator trace).
        Pipelined, it reduces once after the last micro-batch, and nothing is seen held."""
        plan = self.plan
        fsdp_reduces = plan.sharding.startswith("fsdp") and plan.pp == 1
        return self._unit_bytes(stage) if fsdp_reduces else 0.0

    def _fsdp_gather(self, rows: _Rows, after: int | None, stage: int, phase: str) -> int:
        """FSDP2's all-gather of a stage's blocks, one unit at a time (measured on gloo ranks, torch 2.13).

        fsdp_full frees each unit after its forward; its backward gathers the next unit while the current one
        runs (backward prefetch), so two units are live. fsdp_grad_op keeps every unit gathered from its forward
        to its backward: the whole stage, allocated here and freed by the backward that reshards
        (gnn.layout.variant says which). Over dp > 1, gloo passes each all-gather through one more unit-sized
        buffer of its own (allocated inside the c10d call, freed when the work ends).

        Not charged: the stage's root unit (embedding, head) also stays gathered through each pass under
        fsdp_full (seen in the allocator trace), but charging it overshoots the measured peaks (simulator
        MAPE 4.8% -> 5.8% on 267 re-measured FSDP rows with dp > 1; no change without dp), so something else
        here is over-charged.
        """
        full, plan = self._stage_bytes(stage), self.plan
        keep = plan.sharding == "fsdp_grad_op" and phase == "forward"
        prefetch = 2 if phase == "backward" and plan.dp > 1 else 1
        if phase == "backward" and plan.pp > 1:
            prefetch = self.layers_per_stage  # nothing reshards after a backward: the stage ends it gathered
        staging = self._unit_bytes(stage) if self.gloo and plan.dp > 1 else 0.0
        units = self._fsdp_units(stage)
        return rows.add(after, "fsdp_allgather", phase, stage, count=units, message_bytes=full / plan.dp / units,
                        group=plan.dp, crosses_node=self.dp_cross, alloc_bytes=full if keep else 0.0,
                        transient_bytes=staging + (0.0 if keep else prefetch * self._unit_bytes(stage)))

    def _tp_comm(self, rows: _Rows, after: int | None, stage: int, phase: str) -> int:
        return rows.add(after, "tp_comm", phase, stage, count=self.layers_per_stage,
                        message_bytes=self.c.boundary_bytes, group=self.plan.tp, crosses_node=self.tp_cross)

    def estimate(self, kind: str, phase: str, count: int, flops: float, message_bytes: float, group: int,
                 crosses_node: bool) -> float:
        """A node's estimated seconds. The same node recurs across stages and passes: each distinct one is costed
        once."""
        key = (kind, phase, count, flops, message_bytes, group, crosses_node)
        cost = self.costs.get(key)
        if cost is None:
            cost = self.costs[key] = self._cost(*key)
        return cost

    def _cost(self, kind: str, phase: str, count: int, flops: float, message_bytes: float, group: int,
              crosses_node: bool) -> float:
        if kind in COMM_KINDS:
            op = COLLECTIVE.get(kind) or ("reduce_scatter" if self.plan.sequence_parallel else "all_reduce")
            per_call = self.hw.comm_time(op, message_bytes, group, crosses_node)
            if kind == "tp_comm" and self.plan.sequence_parallel:
                per_call += self.hw.comm_time("all_gather", message_bytes / group, group, crosses_node)
            return count * per_call
        if self.hw.blocks is not None:
            return count * self._block_seconds(kind, phase)
        return self.hw.compute_time(flops, self.w.dtype)

    # --- compute from the block profile (gnn.block_model) --------------------------------------------------

    def _features(self, block: str) -> tuple[float, float, float]:
        return block_features(self.c, block, dtype_bytes(self.w))

    def _wrappers(self, phase: str) -> list[str]:
        """The block profile's layer variants this plan wraps its layers in, for a forward or backward."""
        plan, found = self.plan, []
        if plan.tp > 1:
            found.append("tp_sp" if plan.sequence_parallel else "tp")
        if plan.sharding.startswith("fsdp"):  # FSDP's hooks run at dp = 1 too
            found.append(plan.sharding)
        if plan.recompute != "none" and phase == "forward":  # in backward, checkpointing is the recompute node
            found.append(plan.recompute)
        return found

    def _block_seconds(self, kind: str, phase: str) -> float:
        """One block's seconds: its plain cost, plus half of what the plan's wrappers add to a layer for an
        attention or MLP block (they wrap the layer, its two blocks together). A recompute node costs what
        checkpointing adds to a layer's backward."""
        blocks, layer = self.hw.blocks, self._features("layer")
        if phase == "recompute":
            return max(blocks.wrapper_seconds(self.plan.recompute, "backward", layer), 0.0)
        seconds = blocks.seconds(kind, "plain", phase, self._features(kind))
        if kind in ("attn", "mlp"):
            seconds += 0.5 * sum(self._wrapper_seconds(v, phase, layer) for v in self._wrappers(phase))
        return max(seconds, 0.0)

    def _wrapper_seconds(self, variant: str, phase: str, layer: tuple[float, float, float]) -> float:
        """What a wrapper adds to a layer's phase. Tensor parallelism, where the profile timed a layer on a pool
        of tp real ranks: that layer less what the graph charges besides (the plain attention and MLP blocks
        at their shard, and the layer's two tp_comm calls): DTensor's collective path on a real group, which a
        one-rank mesh and the raw collective curves both miss. Elsewhere the one-rank wrapper cost."""
        blocks, plan = self.hw.blocks, self.plan
        group = blocks.group_seconds(variant, plan.tp, phase, layer) if variant in ("tp", "tp_sp") else None
        if group is None:
            return blocks.wrapper_seconds(variant, phase, layer)
        plain = sum(blocks.seconds(kind, "plain", phase, self._features(kind)) for kind in ("attn", "mlp"))
        calls = 2 * self._cost("tp_comm", phase, 1, 0.0, self.c.boundary_bytes, plan.tp, self.tp_cross)
        return max(group - plain - calls, 0.0)

    def _optimizer_seconds(self, stages: tuple[int, ...], params: float) -> float | None:
        """AdamW's step on this rank's ``params`` (already sharded): a cost per tensor and per parameter, on
        DTensors under FSDP or TP. ZeRO-1 steps a plain optimizer over its 1/dp of the tensors."""
        if self.hw.blocks is None:
            return None
        plan, last = self.plan, self.num_stages - 1
        tensors = sum(TENSORS_PER_LAYER * self.layers_per_stage + 2 * (s == 0) + 3 * (s == last) for s in stages)
        if plan.sharding == "zero1":
            tensors /= plan.dp
        variant = "fsdp" if plan.sharding.startswith("fsdp") else "tp" if plan.tp > 1 else "plain"
        return self.hw.blocks.optimizer_seconds(variant, tensors, params)
