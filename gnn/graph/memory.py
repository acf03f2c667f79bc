"""What a pipeline stage holds in memory under a plan: its parameters, FSDP's units and what they keep,
the gradients a stage's first backward allocates, and the state resident per pipeline rank.

The pass compiler (gnn.graph.passes) writes these bytes into the nodes that
allocate, keep and free them; the simulator replays them for the peak.
"""

from __future__ import annotations

from collect.schema import Plan, Workload
from gnn.costs.analytic import (
    BlockCosts,
    block_params,
    dtype_bytes,
    gathered_expert_room,
    gathered_layer_room,
    grad_dtype_bytes,
    stage_moe_layers,
    stage_params,
    state_bytes,
    stepped_params,
)
from gnn.costs.layers import local_expert_params


def last_outputs_kept(plan: Plan) -> bool:
    """Whether the last stage keeps every micro-batch's output to the step's end (StageMemory.output_held_until)."""
    return plan.pipeline_keeps_outputs or plan.pp_schedule == "gpipe"


def sends_held_to_end(plan: Plan) -> bool:
    """Whether what the backward sends stays live to the schedule's end: torch's pipelining
    (plan.pipeline_holds_buffers) waits its backward sends only there under GPipe and the interleaved schedule, each
    before the next forward under 1F1B, and a send holds its tensor until waited."""
    return plan.pipeline_holds_buffers and plan.pp_schedule != "1f1b"


def schedule_read(plan: Plan) -> tuple[bool, bool]:
    """All a pass reads of the plan's schedule (the compilers' keys hold it): whether the last stage keeps its
    outputs to the step's end, whether what the backward sends is held to the schedule's end."""
    return last_outputs_kept(plan), sends_held_to_end(plan)


class StageMemory:
    def __init__(self, w: Workload, plan: Plan, c: BlockCosts, stage_layers: tuple[int, ...]):
        """``stage_layers``: each stage's layer count (Plan.stage_layers)."""
        self.w, self.plan, self.c = w, plan, c
        self.stage_layers, self.num_stages = stage_layers, plan.num_stages

    def output_bytes(self, stage: int) -> float:
        """A micro-batch's output of the stage: the hidden state as the rank holds it (a sequence shard under sequence
        parallelism), or the last stage's logits in the model's dtype."""
        if stage == self.num_stages - 1:
            return self.c.logits_bytes * dtype_bytes(self.w) / 4
        return self.c.residual_bytes

    def output_held_until(self, stage: int) -> str | None:
        """How long a pipelined stage's output of a micro-batch stays live beyond what saving it for backward does:
        "step" (to the iteration's end), "schedule" (to the schedule's end, before the step's merge and optimizer),
        "backward" (to that micro-batch's backward) or None (not beyond its use).

        torch's pipelining (plan.pipeline_holds_buffers) keeps each output to its backward (PipelineStage's
        fwd_cache); its interleaved schedule (_PipelineScheduleRuntime) waits its sends only when the schedule ends,
        and a send holds its tensor until waited, so there every output stays live (1F1B waits each send before the
        next, GPipe frees its sends before its backward). The last stage keeps each output to the step's end when
        the schedule returns them (plan.pipeline_keeps_outputs; under GPipe torch holds as much either way:
        measured 46.3 MB on the last of 2 ranks with and without return_outputs)."""
        plan = self.plan
        if plan.pp == 1:
            return None
        if stage == self.num_stages - 1:
            if last_outputs_kept(plan):
                return "step"
        elif plan.virtual_stages > 1 and plan.pipeline_holds_buffers:  # interleaved (the compilers' keys hold v)
            return "schedule"
        return "backward" if plan.pipeline_holds_buffers else None

    def input_grad_held(self, stage: int) -> bool:
        """Whether the gradient a stage's backward sends for its input stays live to the schedule's end."""
        return stage > 0 and sends_held_to_end(self.plan)

    def sent_bytes(self, stages: tuple[int, ...], microbatches: int) -> float:
        """What the sends of a rank holding ``stages`` keep live to its schedule's end, all freed before its step."""
        outputs = sum(self.output_bytes(s) for s in stages if self.output_held_until(s) == "schedule")
        input_grads = sum(self.c.residual_bytes for s in stages if self.input_grad_held(s))
        return microbatches * (outputs + input_grads)

    def merged_outputs_bytes(self, stages: tuple[int, ...], microbatches: int) -> float:
        """What a rank holding ``stages`` allocates at its step's end to merge the outputs its last stage kept
        (torch.cat of every micro-batch's, beside them, for schedule.step's return value), or 0."""
        last = self.num_stages - 1
        if last not in stages or not self.plan.pipeline_keeps_outputs or self.output_held_until(last) != "step":
            return 0.0
        return microbatches * self.output_bytes(last)

    def pipelined_fsdp(self) -> bool:
        """FSDP over dp > 1 inside torch.distributed.pipelining: its stages turn off FSDP's gradient sync and
        its resharding after backward for every micro-batch, and reduce-scatter once, after the last."""
        plan = self.plan
        return plan.pp > 1 and plan.data_ranks > 1 and plan.fsdp_enabled

    def grad_bytes(self, stage: int) -> float:
        """The gradients a stage's first backward allocates: unsharded while pipelining defers FSDP's sync, each
        weight's whole gradient, the routed experts' those of this ep rank's experts (not the data ranks' multiple
        of their shard: that counted every ep rank's experts)."""
        if not self.pipelined_fsdp():
            return self.state(stage)["grad"]
        whole_embedding = self.embedding_grad_bytes() * (1 - 1 / self.plan.tp) if stage == 0 else 0.0
        return self.params(stage) * grad_dtype_bytes(self.w, self.plan) + whole_embedding

    def embedding_grad_bytes(self) -> float:
        """The token embedding's gradient as its backward makes it: the whole table, on every rank. DTensor's
        embedding backward has no strategy sharded over the vocabulary (torch.distributed.tensor._ops._embedding_ops),
        so under tensor parallelism each rank makes a Partial gradient of the whole table, which a pipelined FSDP
        stage accumulates so until its last micro-batch (traced: Llama 3.1 8B at tp 8, 1,002 MiB, not its 125 MiB
        shard)."""
        return self.w.vocab * self.w.hidden * grad_dtype_bytes(self.w, self.plan)

    def embedding_backward_bytes(self) -> float:
        """What the first stage's embedding backward makes beyond the gradients charged: the whole gradient, where
        that is more than the shard charged (tensor parallelism) or made beside the one a pipelined FSDP stage
        accumulates (each micro-batch's is added to it, then freed); and the hidden state's gradient it reads,
        whole, with under tensor parallelism the collective's copy it came through."""
        whole = self.embedding_grad_bytes() if self.plan.tp > 1 or self.pipelined_fsdp() else 0.0
        return whole + self.c.boundary_bytes * (2 if self.plan.tp > 1 else 1)

    def left_gathered(self, stage: int) -> float:
        """What a backward's end still holds gathered beyond the root unit the pass holds to its end: pipelined
        under fsdp_full, every block's unit (torch's pipelining turns FSDP's resharding after backward off for every
        micro-batch, the last too: the next forward reshards them as it goes, the step's reduction group by group,
        StageMemory.gathered_at_reduce)."""
        pipelined_full = self.pipelined_fsdp() and self.plan.reshard_after_forward
        blocks = self.block_params(stage) * dtype_bytes(self.w)  # unpadded: as unsharded
        return blocks if pipelined_full else 0.0

    def gathered_at_reduce(self, stages: tuple[int, ...]) -> float:
        """What pipelined FSDP still holds gathered when the step reduces its first group: every stage's weights,
        under either mode (torch's PipelineStage.perform_reduce_grad reshards each group as it reduces it)."""
        gathered = sum(self.params(s) for s in stages) * dtype_bytes(self.w)  # unpadded: as unsharded
        return gathered if self.pipelined_fsdp() else 0.0

    def grads_written_at_gather(self, stage: int) -> float:
        """Share of a stage's gradients a first backward has allocated at its peak. Under fsdp_full over dp > 1
        the peak comes while the last two units are gathered: the gradient shards of the units before them
        are written, those of these two and of the root unit (embedding, head: reduced at the very end) not
        yet (allocator trace, one micro-batch: 2 of 4 block shards live at the peak). Otherwise all of them: a
        pipelined FSDP stage's peak comes at its backward's end or its step's reduction."""
        if not self.plan.reshard_after_forward or self.plan.data_ranks == 1 or self.pipelined_fsdp():
            return 1.0
        L, c = self.stage_layers[stage], self.c
        return max(L - 2, 0) * c.layer_params / self.params(stage)

    def static_bytes(self) -> list[float]:
        """Resident from the start, per pipeline rank (holding stages rank, rank + pp, ...): parameters, optimizer
        state, DDP's buckets. Gradients are not: the first backward of each stage allocates them
        (gnn.graph.passes), after FSDP has resharded what it gathered."""
        plan = self.plan
        return [
            sum(
                sum(v for k, v in self.state(s).items() if k != "grad") + self.fsdp_held_bytes(s)
                for s in range(rank, plan.num_stages, plan.pp)
            )
            for rank in range(plan.pp)
        ]

    def state(self, stage: int) -> dict[str, float]:
        """The stage's resident state by kind (gnn.costs.analytic.state_bytes)."""
        return state_bytes(self.w, self.plan, self.params(stage), self.expert_params(stage))

    def stepped_params(self, stage: int) -> float:
        """The stage's parameters this rank's optimizer steps (gnn.costs.analytic.stepped_params)."""
        return stepped_params(self.w, self.plan, self.params(stage), self.expert_params(stage))

    def expert_params(self, stage: int) -> float:
        """The routed experts' parameters of the stage's MoE layers on this ep rank."""
        moe = stage_moe_layers(self.w, self.stage_layers, stage)
        return moe * local_expert_params(self.w, self.plan) if moe else 0.0

    def block_params(self, stage: int) -> float:
        return block_params(self.w, self.c, self.stage_layers, stage)

    def params(self, stage: int) -> float:
        return stage_params(self.w, self.plan, self.c, self.stage_layers, stage)

    def stage_bytes(self, stage: int) -> float:
        """The stage's weights as FSDP gathers them: whole, with every rank's padding: routed experts sharded with the
        rest of a block over more ranks than experts (fsdp_expert_share: Qwen3-235B's 128 experts over 16,384 ranks
        gather 16,384 experts' room, 128 times their bytes), and any weight with fewer rows than ranks, or rows not
        divisible by them (gathered_layer_room)."""
        experts = self.expert_params(stage)
        padded = experts * gathered_expert_room(self.w, self.plan) if experts and self.plan.fsdp_enabled else experts
        # the blocks' other weights, padded as FSDP2 gathers them (the embedding and head are left as they are)
        blocks = self.block_params(stage) - experts
        padding = blocks * (gathered_layer_room(self.w, self.plan) - 1)
        return (self.params(stage) - experts + padded + padding) * dtype_bytes(self.w)

    def unit_bytes(self, stage: int) -> float:
        """Unsharded bytes of one block's FSDP unit (the trainer shards block by block), the stage's average."""
        return (self.stage_bytes(stage) - self.root_bytes(stage)) / max(self.stage_layers[stage], 1)

    def root_bytes(self, stage: int) -> float:
        """Unsharded bytes of the stage's root unit: its parameters outside the blocks (embeddings on the first
        stage; final norm and head on the last), which FSDP gathers with the root module, around the whole pass."""
        return (self.params(stage) - self.block_params(stage)) * dtype_bytes(self.w)

    def gathered_root(self, stage: int) -> float:
        """The root unit's bytes a pass gathers and holds to its end: under fsdp_full the root module's
        hooks gather it before the first block and reshard it after the last (allocator trace: it stays gathered
        through each pass)."""
        plan = self.plan
        return self.root_bytes(stage) if plan.reshard_after_forward else 0.0

    def gathered_in_pipelined_backward(self, stage: int, prefetch: int, activations: float) -> float:
        """Unit bytes gathered at a pipelined backward's peak beyond its forward's ``activations``. Nothing reshards
        after it: each block's unit stays gathered as the block's activations are freed, so its first block runs
        with every unit gathered and only its own activations left (and the next forward reshards as it goes). The
        larger of that and the backward's start, ``prefetch`` units beside all the activations."""
        blocks, unit = self.stage_layers[stage], self.unit_bytes(stage)
        freed = activations * (blocks - 1) / max(blocks, 1)
        return max(min(prefetch, blocks) * unit, blocks * unit - freed)

    def fsdp_units(self, stage: int) -> int:
        """FSDP2 units of a stage, each gathered and reduce-scattered by its own collective: every block, and the
        stage's root when it holds parameters of its own (embeddings on the first stage, norm and head on the last)."""
        return self.stage_layers[stage] + (stage == 0 or stage == self.num_stages - 1)

    def fsdp_held_bytes(self, stage: int) -> float:
        """FSDP2 keeps its last gradient reduction's buffers, about one unit, from one iteration into the next
        (at dp = 1 too: a second unit-sized block beside the last unit's gradients in the allocator trace).
        Pipelined, it reduces once after the last micro-batch, and nothing is seen held."""
        plan = self.plan
        fsdp_reduces = plan.fsdp_enabled and plan.pp == 1
        return self.unit_bytes(stage) if fsdp_reduces else 0.0
