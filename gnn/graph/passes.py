"""The nodes of one forward or backward pass of a stage, and of a rank's optimizer step, as table rows.

Every micro-batch of a stage runs the same pass: the same blocks, collectives, costs and memory. Only the first
and last differ (the first backward allocates the gradients; FSDP gathers and frees on the first and last), so a
plan has a handful of distinct passes, which gnn.graph.build repeats across the schedule, filling in the rank and
micro-batch of the rows built here for one stage of a role (first, middle, last). Nothing here reads the plan's
micro-batch count (a step is told it) or its schedule but for GPipe's (gnn.graph.layout places the passes), so the
two short graphs of a truncated plan (gnn.sim.plan) share one compiler, and so can a batch's plans that differ only
in those (``shared_compiler``).
"""

from __future__ import annotations

from collect.schema import CONVENTIONS, Cluster, Plan, Workload
from gnn.costs.analytic import BlockCosts, block_costs, grad_dtype_bytes, saved_bytes_per_layer
from gnn.costs.hardware import HardwareModel
from gnn.costs.layers import recompute_flop_share
from gnn.costs.pricing import Pricing, network
from gnn.graph.layout import stage_role, uneven_layers
from gnn.graph.memory import StageMemory, schedule_read
from gnn.graph.step import compile_step, overlap_windows, with_schedule_end
from gnn.graph.table import COL, KINDS
from gnn.graph.template import PassRows, PassTemplate


def shared_compiler(cache: dict | None, w: Workload, plan: Plan, cluster: Cluster, hw: HardwareModel) -> "PassCompiler":
    """A compiler for the plan, taken from ``cache`` (the caller's, for one batch of plans) when an earlier plan
    differed only in schedule and micro-batch count. The cache holds references to ``hw``: scope it to a batch."""
    if cache is None:
        return PassCompiler(w, plan, cluster, hw)
    key = (w, cluster, id(hw), *schedule_read(plan), *(v for name, v in plan if name not in _PLACEMENT_ONLY))
    found = cache.get(key)
    if found is None or found.hw is not hw:
        found = cache[key] = PassCompiler(w, plan, cluster, hw, cache.setdefault(_SHARED, {}))
    return found


# the collective that follows a block's compute, per layer: the ring's key/value passes, the experts' combine
_AFTER = {"attn": "cp_ring", "mlp": "ep_a2a"}
_PLACEMENT_ONLY = ("pp_schedule", "num_microbatches")  # plan fields gnn.graph.layout reads and the passes do not
_SHARED = ("templates",)  # the key, in a shared_compiler cache, of the templates its compilers share


class PassCompiler:
    def __init__(self, w: Workload, plan: Plan, cluster: Cluster, hw: HardwareModel, shared: dict | None = None):
        """``shared``: templates shared with the batch's other compilers, by what their rows read (template, step)."""
        self.w, self.plan, self.hw = w, plan, hw
        self.gloo = cluster.backend == "gloo"
        self.cuda = cluster.device == "cuda"
        self.c: BlockCosts = block_costs(w, plan)
        self.num_stages = plan.num_stages  # a computed property of the plan: read once, it is read per pass
        self.stage_layers = plan.stage_layers(w.layers, w.pipeline_costs)
        self.uneven = uneven_layers(plan, w)
        self.templates: dict[tuple, PassTemplate] = {}
        self.shared = {} if shared is None else shared
        # the shared passes and steps of plans that agree on what this one's depend on besides their stage roles,
        # variants and sharding (see template, step): looked up once here, as the key holds the workload and
        # cluster, whose hashes and comparisons are costly
        what = (id(hw), w, cluster, plan.dp, plan.cp, plan.ep, plan.etp, plan.tp, plan.pp, plan.virtual_stages)
        what += (plan.recompute, *schedule_read(plan))
        conventions = tuple(getattr(plan, k) for k in CONVENTIONS)
        self._shared_passes = self.shared.setdefault((*what, plan.sequence_parallel, *conventions), {})
        self._shared_steps = self.shared.setdefault(("S", id(hw), w), {})
        self._static: list[float] | None = None
        self.activations: dict[tuple[bool, bool, int], float] = {}  # per stage role (layout.stage_role)
        per_node = cluster.nvlink_ranks  # a group crosses the network once it spans more than an NVLink domain
        # mesh order (pp, dp, cp, tp) with tp innermost: a group crosses nodes once its span exceeds a node
        self.tp_cross = plan.tp > per_node
        self.cp_cross = plan.tp * plan.cp > per_node
        self.ep_cross = plan.expert_tp * plan.ep > per_node  # Megatron's expert grid: etp innermost, then ep
        self.dp_cross = plan.tp * plan.data_ranks > per_node
        self.pp_cross = plan.tp * plan.data_ranks * plan.pp > per_node and plan.pp > 1
        self.memory = StageMemory(w, plan, self.c, self.stage_layers)
        self.pricing = Pricing(w, plan, self.c, hw, self.stage_layers, self.tp_cross, network(cluster, hw))

    def _role(self, stage: int) -> tuple[bool, bool, int]:
        return stage_role(stage, self.num_stages - 1, self.uneven)

    def template(self, phase: str, stage: int, variant: tuple[bool, ...]) -> PassTemplate:
        """A forward or backward pass (variants: gnn.graph.layout.variant). Stages in the middle of the pipeline hold
        the same blocks, so one template serves every stage of a role (first, middle, last), and plans of a batch
        that agree on all the pass reads of them (``_sharding_read``) share it."""
        key = (phase, *self._role(stage), *variant)
        found = self.templates.get(key)
        if found is None:
            if phase == "B" and variant[0]:  # a stage's first backward: per plan, it charges the gradients
                found = self._backward(stage, *variant)
            else:
                shared_key = (key, self._sharding_read(phase, variant))
                found = self._shared_passes.get(shared_key)
                if found is None:
                    compile_pass = self._forward if phase == "F" else self._backward
                    found = self._shared_passes[shared_key] = compile_pass(stage, *variant)
            self.templates[key] = found
        return found

    def _sharding_read(self, phase: str, variant: tuple[bool, ...]):
        """What a forward or (not first) backward pass reads of the plan's sharding: a forward, only which FSDP
        mode gathers for it, if it gathers; a backward, whether FSDP fully shards (it gathers, and charges the
        gradients there) and whether it reduce-scatters; both, with a block profile, which FSDP mode wraps the
        layers (its hooks cost time whether or not the pass gathers)."""
        plan = self.plan
        fsdp = plan.fsdp_enabled
        wrapper = plan.sharding if fsdp and self.hw.blocks is not None else None  # its hooks' cost (block profile)
        if phase == "F":
            return plan.sharding if variant[0] else None, wrapper
        return plan.reshard_after_forward, fsdp and plan.data_ranks > 1, wrapper

    # --- the passes ----------------------------------------------------------------------------------------

    def _forward(self, stage: int, gathers: bool) -> PassTemplate:
        plan, c, L = self.plan, self.c, self.stage_layers[stage]
        rows, last = PassRows(self.pricing), None
        if gathers:
            last = self._fsdp_gather(rows, last, stage, "forward")
        if stage == 0:
            last = rows.add(last, "embed", "forward", stage, alloc_bytes=c.boundary_bytes)
        saved = saved_bytes_per_layer(c, plan)
        for kind, flops in (("attn", c.attn_flops), ("mlp", c.mlp_flops)):
            if kind == "mlp":
                last = self._layer_comm(rows, last, stage, "forward", "ep_a2a")  # dispatch
            last = rows.add(last, kind, "forward", stage, count=L, flops=L * flops, alloc_bytes=L * saved / 2)
            if stage > 0 and kind == "attn" and plan.pipeline_holds_buffers:
                rows.hold(last, c.residual_bytes)  # pipelining's receive buffer for this micro-batch's input
            last = self._layer_comm(rows, last, stage, "forward", _AFTER[kind])
            last = self._layer_comm(rows, last, stage, "forward", "tp_comm")
        if stage == plan.num_stages - 1:
            logits = c.logits_bytes
            last = rows.add(
                last, "head", "forward", stage, flops=c.head_flops, alloc_bytes=logits, transient_bytes=2 * logits
            )
        else:
            last = rows.add(
                last, "p2p", "forward", stage, message_bytes=c.residual_bytes, group=2, crosses_node=self.pp_cross
            )
        output, until = self.memory.output_bytes(stage), self.memory.output_held_until(stage)
        if until in ("step", "schedule"):
            rows.hold(last, output)
        elif until == "backward":
            rows.keep(last, output)
        rows.set(last, "free_bytes", self.memory.gathered_root(stage) if gathers else 0.0)  # the root resharded
        return rows.done(last)

    def _saved_bytes(self, stage: int, frees_gather: bool) -> float:
        """What a forward of the stage keeps for its backward: activations, and under grad_op the parameters
        gathered for the micro-batches up to the backward that reshards."""
        return self._activations(stage) + (self.memory.stage_bytes(stage) if frees_gather else 0.0)

    def _activations(self, stage: int) -> float:
        """The activations a forward of the stage saves, whichever variant: only the FSDP gather differs."""
        role = self._role(stage)
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
            if self.memory.pipelined_fsdp():  # the embedding's gradient is made here, not beside an earlier one
                embed = table[:, COL["kind"]] == KINDS.index("embed")
                table[embed, COL["transient_bytes"]] -= self.memory.embedding_grad_bytes()
                table[other.end, COL["transient_bytes"]] += table[other.end, COL["free_bytes"]]  # made before it
            grads = self.memory.grad_bytes(stage)
            # pipelined FSDP's unsharded gradients come as the blocks' activations go: charged at the end
            early = 0.0 if self.memory.pipelined_fsdp() else grads * self.memory.grads_written_at_gather(stage)
            table[other.grads_at, COL["alloc_bytes"]] += early
            table[other.end, COL["alloc_bytes"]] += grads - early
            return PassTemplate(table, other.edges, other.end, other.grads_at, other.kept_bytes, other.shape)
        plan, c, L = self.plan, self.c, self.stage_layers[stage]
        last_stage = stage == plan.num_stages - 1
        rows, last = PassRows(self.pricing), None
        if plan.reshard_after_forward:
            # FSDP2 writes each unit's gradient shards as its backward ends, while it gathers the next units: the
            # peak comes late in the backward, with most shards written. Charged here, where the gathers start.
            last = grads_at = self._fsdp_gather(rows, last, stage, "backward")
        if plan.recompute != "none":
            share = recompute_flop_share(plan.recompute)
            last = rows.add(
                last,
                "attn",
                "recompute",
                stage,
                count=L,
                flops=share * L * (c.attn_flops + c.mlp_flops),
                transient_bytes=c.activation_bytes_per_layer,
            )
        if last_stage:
            last = rows.add(last, "head", "backward", stage, flops=2 * c.head_flops, transient_bytes=c.logits_bytes)
        for kind, flops in (("mlp", c.mlp_flops), ("attn", c.attn_flops)):
            last = self._layer_comm(rows, last, stage, "backward", "tp_comm")
            if kind == "mlp":
                last = self._layer_comm(rows, last, stage, "backward", "ep_a2a")
            held = c.mlp_grad_bytes if kind == "mlp" else 0.0  # the MLP's activations' gradients, at once
            last = rows.add(last, kind, "backward", stage, count=L, flops=2 * L * flops, transient_bytes=held)
            last = self._layer_comm(rows, last, stage, "backward", _AFTER[kind])
        rows.set(last, "free_bytes", self._saved_bytes(stage, frees_gather))  # before the embedding's gradient is made
        if stage == 0:
            made = self.memory.embedding_backward_bytes()
            last = rows.add(last, "embed", "backward", stage, transient_bytes=made)
        rows.set(last, "free_bytes", rows.rows[last][COL["free_bytes"]] + self.memory.gathered_root(stage))
        # pipelining keeps, per micro-batch, the buffer it received this stage's output gradient in; the gradient it
        # sends for the stage's input lives until the send is waited (StageMemory.input_grad_held)
        if plan.pipeline_holds_buffers:
            held = (stage < plan.num_stages - 1) + self.memory.input_grad_held(stage)
            rows.hold(last, c.residual_bytes * held)
        if plan.fsdp_enabled and plan.data_ranks > 1 and not self.memory.pipelined_fsdp():
            # a unit's unsharded gradients and the reduce-scatter's input copy of them are live together
            units = self.memory.fsdp_units(stage)
            scatter = rows.add(
                last, "fsdp_reducescatter", "backward", stage, count=units,
                message_bytes=self.memory.params(stage) * grad_dtype_bytes(self.w, plan) / units,
                group=plan.data_ranks, crosses_node=self.dp_cross,
                transient_bytes=2 * max(self.memory.unit_bytes(stage), self.memory.root_bytes(stage)),
            )  # fmt: skip
            if not plan.reshard_after_forward:
                grads_at = scatter
        elif not plan.reshard_after_forward:
            grads_at = last
        if stage > 0:
            last = rows.add(
                last, "p2p", "backward", stage, message_bytes=c.residual_bytes, group=2, crosses_node=self.pp_cross
            )
        rows.set(last, "transient_bytes", rows.rows[last][COL["transient_bytes"]] + self.memory.left_gathered(stage))
        return rows.done(last, grads_at)

    def step(self, stages: tuple[int, ...], microbatches: int) -> PassTemplate:
        """A rank's end of iteration: DDP's gradient all-reduce, the optimizer, ZeRO-1's parameter all-gather.
        Its rows depend on the parameters held, how they are sharded and reduced, the hardware and, where they
        overlap compute, the compute they hide under: plans of a batch that agree on those share it, as do ranks
        whose stages have the same roles (gnn.graph.build writes each rank's own stage into the rows it places),
        led by what the schedule's end does with its ``microbatches`` (gnn.graph.step.with_schedule_end)."""
        plan = self.plan
        roles = tuple(self._role(s) for s in stages)
        key = (plan.tp, plan.dp, plan.cp, plan.ep, plan.pp, plan.sharding, plan.fp32_grads, self.stage_layers, roles)
        windows = overlap_windows(plan, stages, self.template)
        key += (self.dp_cross, plan.grad_reduce_overlap, plan.param_gather_overlap, windows, plan.sequence_parallel)
        found = self._shared_steps.get(key)
        if found is None:
            found = compile_step(self.memory, self.pricing, self.dp_cross, stages, windows, foreach=self.cuda)
            self._shared_steps[key] = found
        sent, merged = (f(stages, microbatches) for f in (self.memory.sent_bytes, self.memory.merged_outputs_bytes))
        return with_schedule_end(found, stages[0], sent, merged)

    def static_bytes(self) -> list[float]:
        """Resident from the start, per pipeline rank (StageMemory.static_bytes), computed once."""
        self._static = self._static or self.memory.static_bytes()
        return list(self._static)

    # --- pieces --------------------------------------------------------------------------------------------

    def _fsdp_gather(self, rows: PassRows, after: int | None, stage: int, phase: str) -> int:
        """FSDP2's all-gather of a stage's blocks, one unit at a time (measured on gloo ranks, torch 2.13).

        fsdp_full frees each unit after its forward; its backward gathers the next unit while the current one
        runs (backward prefetch), so two units are live. fsdp_grad_op keeps every unit gathered from its forward
        to its backward: the whole stage, allocated here and freed by the backward that reshards
        (gnn.graph.layout.variant says which). Over dp > 1, gloo passes each all-gather through one more unit-sized
        buffer of its own (allocated inside the c10d call, freed when the work ends).

        Under fsdp_full the stage's root unit (embedding, head) is gathered here too, and held to the pass's end.
        """
        full, plan = self.memory.stage_bytes(stage), self.plan
        keep = plan.sharding == "fsdp_grad_op" and phase == "forward"
        prefetch = 2 if phase == "backward" and plan.data_ranks > 1 else 1
        gathered = prefetch * self.memory.unit_bytes(stage)
        if phase == "backward" and plan.pp > 1:  # nothing reshards after a pipelined backward
            gathered = self.memory.gathered_in_pipelined_backward(stage, prefetch, self._activations(stage))
        staging = self.memory.unit_bytes(stage) if self.gloo and plan.data_ranks > 1 else 0.0
        units = self.memory.fsdp_units(stage)
        return rows.add(
            after, "fsdp_allgather", phase, stage, count=units,
            message_bytes=full / plan.data_ranks / units / (2 if plan.float8_all_gather else 1),  # FP8: 1 byte
            group=plan.data_ranks, crosses_node=self.dp_cross,
            alloc_bytes=full if keep else self.memory.gathered_root(stage),
            transient_bytes=staging + (0.0 if keep else gathered),
        )  # fmt: skip

    def _layer_comm(self, rows: PassRows, after: int | None, stage: int, phase: str, kind: str) -> int | None:
        """A collective each layer of the stage runs, if the plan has it: tensor parallelism's all-reduce (or
        reduce-scatter and all-gather); an expert-parallel all-to-all (dispatch before the experts, combine
        after); ring attention's cp - 1 key/value passes (the backward's carry their gradients too: twice the
        bytes). None of them overlaps compute here: for the ring, that makes cp's time an upper bound."""
        plan, c = self.plan, self.c
        enabled, times, message, group, crosses = {
            "tp_comm": (plan.tp_enabled, 1, c.boundary_bytes, plan.tp, self.tp_cross),
            "ep_a2a": (plan.ep_enabled, 1, c.a2a_bytes, plan.ep, self.ep_cross),
            "cp_ring": (plan.cp_enabled, plan.cp - 1, c.ring_bytes * (1 + (phase == "backward")), 2, self.cp_cross),
        }[kind]
        if not enabled:
            return after
        count = self.stage_layers[stage] * times
        return rows.add(
            after, kind, phase, stage, count=count, message_bytes=message, group=group, crosses_node=crosses
        )
