"""The plan space of one (workload, cluster, global batch): every valid plan, or one chosen by name.

A plan here fixes dp x cp x tp x pp (their product is the world size), sharding,
recompute, pipeline schedule (and virtual stages), sequence parallel, the
micro-batch size and count (dp x micro_batch_size x num_microbatches = the
global batch), the expert-parallel degree of a moe model (borrowed from dp x cp, and
from tp where the experts stay whole: etp 1 beside the experts split as the MLP,
etp = tp) and, on GPUs with FP8 matmuls, the precision (bfloat16, or FP8 with
tensorwise or rowwise scaling, tensorwise under FSDP perhaps all-gathering in FP8;
Blackwell's MXFP8 and NVFP4 too), and the conventions of the framework named
(loss sharded over tp, what the pipeline keeps). Only combinations the schema accepts (plan_problems) exist, only
those a prediction request would take alone (gnn.inference.cost: a pp 256 x 512 pipeline is left out, and counted),
and, for a space whose plans are to be measured here, only those the collector runs (collect_problems). The
candidates (every combination of the choices above) are walked one by one, counted by arithmetic, or drawn at
random (serve.search.budget prices a search from such a sample).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

from collect.schema import (
    PIPELINE_SCHEDULES,
    RECOMPUTES,
    SHARDINGS,
    Cluster,
    Plan,
    RunSpec,
    Workload,
    collect_problems,
    framework_conventions,
    plan_problems,
)
from collect.sweep import divisors, layouts
from gnn import cancel
from gnn.inference.cost import REQUEST_BYTES, REQUEST_SECONDS, over_budget, plan_cost
from serve.schemas import SearchRequest, limit_problems

Layout = tuple[int, int, int, int]  # (pp, dp, cp, tp)


@dataclass(frozen=True)
class Space:
    workload: Workload  # its micro_batch_size (and float8, where precisions are searched) are replaced per plan
    cluster: Cluster
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    virtual_stages: tuple[int, ...] = (2,)
    shardings: tuple[str, ...] = SHARDINGS
    recomputes: tuple[str, ...] = RECOMPUTES
    schedules: tuple[str, ...] = PIPELINE_SCHEDULES
    max_tp: int = field(default=8)
    context_parallel: tuple[int, ...] = (1, 2, 4, 8)
    """cp degrees tried (each must also divide the sequence into 2 x cp chunks); (1,) leaves cp out."""
    precisions: tuple[str, ...] = ()
    """workload.float8 choices (serve.search.study gives all three on GPUs with FP8 matmuls); () keeps the
    workload's own."""
    collectable_only: bool = False
    """Only plans the local collector can measure (collect_problems): for proofs that measure what they find."""
    framework: str = "torch"
    """Whose conventions each plan takes (collect.schema.framework_conventions): torch (the collector's),
    megatron, nanotron or torchtitan."""
    max_plan_seconds: float = REQUEST_SECONDS
    max_plan_bytes: float = REQUEST_BYTES
    """A plan whose prediction alone is estimated over these (gnn.inference.cost.over_budget) is left out of the
    space, and counted (``over_budget_plans``): the service would refuse it as a request of its own."""
    # filled as the space is walked: validity per key (spec), the workload per micro-batch size and precision
    _valid: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _workloads: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _census: tuple[int, int] | None = field(default=None, init=False, repr=False, compare=False)  # plans, over budget
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # serve.search.budget's findings

    def shardings_for(self, dp: int, tp: int) -> list[str]:
        """The shardings of a layout: all of them, or, collectable only, those torch composes with tp."""
        if not self.collectable_only:
            return list(self.shardings)
        return [s for s in self.shardings if not ((s == "none" and tp > 1 and dp > 1) or (s == "zero1" and tp > 1))]

    @property
    def global_batch_size(self) -> int:
        return self.workload.global_batch_size

    def layouts(self) -> list[Layout]:
        """(pp, dp, cp, tp) with tp within a node: tensor parallelism across nodes is never the fast choice."""
        return self._layouts

    @cached_property
    def _layouts(self) -> list[Layout]:
        limit = min(self.max_tp, self.cluster.devices_per_node)
        out = []
        for pp, rest, tp in layouts(self.cluster.world_size):
            if tp <= limit:
                out += [(pp, rest // cp, cp, tp) for cp in self.context_parallel if rest % cp == 0]
        return out

    @cached_property
    def layouts_by_name(self) -> dict[str, Layout]:
        """The layouts as the search's categorical choices, computed once per space, not once per trial."""
        return {layout_name(lay): lay for lay in self.layouts()}

    @cached_property
    def expert_degrees(self) -> tuple[int, ...]:
        """ep choices: divisors of the expert count (1 only for dense models); a layout keeps those dividing dp x cp."""
        w = self.workload
        return tuple(divisors(w.experts)) if w.family == "moe" else (1,)

    def precision_choices(self, sharding: str) -> list[tuple[str, bool]]:
        """(float8, float8_all_gather) pairs: FP8 all-gathers only with tensorwise scaling under FSDP."""
        fsdp = sharding.startswith("fsdp")
        choices = self.precisions or (self.workload.float8,)
        return [(f8, g) for f8 in choices for g in ((False, True) if f8 == "tensorwise" and fsdp else (False,))]

    def spec(
        self, layout: Layout, mbs: int, sharding: str, recompute: str, schedule: str | None, virtual: int, sp: bool,
        ep: int = 1, float8: str | None = None, float8_all_gather: bool = False, etp: int | None = None,
    ) -> RunSpec | None:  # fmt: skip
        """The RunSpec of one choice, or None if the choice is not a valid plan."""
        pp, dp, cp, tp = layout
        samples = dp * mbs
        if self.global_batch_size % samples:
            return None
        # whether a plan is valid does not depend on its sharding or recompute (plan_problems reads sharding only
        # for float8_all_gather, part of the key): checked once per key, not once per sharding and recompute
        key = (layout, mbs, schedule, virtual, sp, ep, float8, float8_all_gather, etp)
        if self._valid.get(key, True) is not True:
            return None
        w = self._workload(mbs, float8)
        p = Plan.model_construct(
            dp=dp, cp=cp, tp=tp, pp=pp, ep=ep, etp=etp, sharding=sharding, recompute=recompute,
            pp_schedule=schedule if pp > 1 else None, virtual_stages=virtual if pp > 1 else 1,
            num_microbatches=self.global_batch_size // samples, sequence_parallel=sp,
            float8_all_gather=float8_all_gather, **framework_conventions(self.framework, tp, sp, w.dtype, w.float8),
        )  # fmt: skip
        valid = self._valid.get(key)
        if valid is None:
            valid = self._valid[key] = self._admit(w, p)
        if valid is not True:
            return None
        if self.collectable_only and collect_problems(w, p, self.cluster):
            return None
        return RunSpec.model_construct(workload=w, plan=p, cluster=self.cluster)

    def _admit(self, w: Workload, p: Plan) -> bool | str:
        """True for a plan of the space, False for an invalid one, OVER_BUDGET for one too costly to predict."""
        if limit_problems(p) or plan_problems(w, p, self.cluster):
            return False
        if over_budget(plan_cost(p), self.max_plan_seconds, self.max_plan_bytes):
            return OVER_BUDGET
        return True

    def _workload(self, mbs: int, float8: str | None) -> Workload:
        """The workload at a micro-batch size and precision, made once per pair."""
        key = (mbs, float8)
        found = self._workloads.get(key)
        if found is None:
            update = {"micro_batch_size": mbs} | ({"float8": float8} if float8 is not None else {})
            found = self._workloads[key] = self.workload.model_copy(update=update)
        return found

    def enumerate(self) -> list[RunSpec]:
        """Every valid plan of the space (computed once per space)."""
        return self._plans

    @cached_property
    def _plans(self) -> list[RunSpec]:
        return list(self.iter_plans())

    def iter_plans(self, meter=None) -> Iterator[RunSpec]:
        """The valid plans of the space, in enumerate()'s order, one at a time (``meter``: as _walk's)."""
        for choice in self._walk(meter):
            spec = self.spec(*choice)
            if spec is not None:
                yield spec

    def count(self, limit: int | None = None, meter=None) -> int:
        """How many plans the space holds, or limit + 1 once it is known to hold more than ``limit``; without
        building them where validity is already known (about a microsecond a candidate). The whole count is kept,
        with the plans left out for their cost (``over_budget_plans``)."""
        if self._census is not None:
            return self._census[0] if limit is None else min(self._census[0], limit + 1)
        n = over = 0
        for choice in self._walk(meter):
            state = self.state(choice)
            n += state is True
            over += state == OVER_BUDGET
            if limit is not None and n > limit:
                return n
        object.__setattr__(self, "_census", (n, over))
        return n

    @property
    def over_budget_plans(self) -> int | None:
        """Plans left out for their cost, once the space has been counted whole (None before)."""
        return None if self._census is None else self._census[1]

    def _walk(self, meter) -> Iterator[tuple]:
        """The candidates in order; every STOP_CHECK_EVERY of them a stop is looked for (gnn.cancel) and the walk
        is paid for on ``meter`` (serve.search.budget.Meter)."""
        for n, choice in enumerate(self._choices()):
            if n % STOP_CHECK_EVERY == 0:
                cancel.check("walking the plan space")
                if meter is not None:
                    meter.walk(STOP_CHECK_EVERY)
            yield choice

    def state(self, choice: tuple) -> bool | str:
        """A candidate's standing: True (a plan of the space), False (not a valid plan) or OVER_BUDGET."""
        layout, mbs, _, _, schedule, virtual, sp, ep, f8, gather, etp = choice
        key = (layout, mbs, schedule, virtual, sp, ep, f8, gather, etp)
        known = self._valid.get(key)
        if known is not None and not (known is True and self.collectable_only):
            return known
        if self.spec(*choice) is not None:
            return True
        known = self._valid.get(key, False)
        return False if known is True else known  # True: a valid plan the collector cannot run

    @cached_property
    def groups(self) -> list[tuple[Layout, int, str, str]]:
        """(layout, micro-batch size, sharding, recompute) with a plan that fills the batch, in walking order."""
        return [
            (layout, mbs, sharding, recompute)
            for layout, mbs, sharding, recompute in itertools.product(
                self.layouts(), self.micro_batch_sizes, self.shardings, self.recomputes
            )
            if self.global_batch_size % (layout[1] * mbs) == 0  # else no plan of it fills the batch
        ]

    def inner(self, layout: Layout, sharding: str) -> tuple[list, ...]:
        """The choices within a group: (schedule, virtual), sequence parallel, (etp, ep), (float8, all-gather)."""
        pp, dp, cp, tp = layout
        schedules = (
            [(None, 1)]
            if pp == 1
            else [(s, v) for s in self.schedules for v in (self.virtual_stages if s == "interleaved_1f1b" else (1,))]
        )
        sp = [False, True] if tp > 1 else [False]
        return schedules, sp, self.expert_layouts(layout), self.precision_choices(sharding)

    def _choices(self) -> Iterator[tuple]:
        for layout, mbs, sharding, recompute in self.groups:
            for (schedule, virtual), sp, (etp, ep), (f8, gather) in itertools.product(*self.inner(layout, sharding)):
                yield layout, mbs, sharding, recompute, schedule, virtual, sp, ep, f8, gather, etp

    @cached_property
    def sizes(self) -> list[int]:
        """Candidates per group, cumulative: by arithmetic, without walking them."""
        sizes = (math.prod(map(len, self.inner(layout, sharding))) for layout, _, sharding, _ in self.groups)
        return list(itertools.accumulate(sizes))

    def candidates(self) -> int:
        """How many candidate choices the space walks (valid or not)."""
        return self.sizes[-1] if self.sizes else 0

    def expert_tps(self, tp: int) -> tuple[int | None, ...]:
        """etp choices: the experts split as the MLP (None: etp = tp), or, with tp > 1 on a moe model, whole (1)."""
        return (None, 1) if tp > 1 and self.workload.family == "moe" else (None,)

    def expert_layouts(self, layout: Layout) -> list[tuple[int | None, int]]:
        """(etp, ep) pairs of a layout: ep dividing the ranks the experts borrow, (dp x cp x tp) / etp."""
        pp, dp, cp, tp = layout
        return [
            (etp, ep)
            for etp in self.expert_tps(tp)
            for ep in self.expert_degrees
            if (dp * cp * tp // (etp or tp)) % ep == 0
        ]


STOP_CHECK_EVERY = 2048
OVER_BUDGET = "over budget"  # a candidate that is a valid plan, left out for what predicting it would cost


def space_of(request: SearchRequest, max_plan_bytes: float = REQUEST_BYTES) -> Space:
    """The request's plan space, of plans whose prediction alone holds at most ``max_plan_bytes``."""
    w = request.workload
    # bfloat16 or FP8 where the GPUs have FP8 matmuls: the precision is part of the plan a user picks
    choices = request.cluster.float8_choices
    precisions = choices if len(choices) > 1 and w.dtype == "bfloat16" else ()
    return Space(w, request.cluster.cluster(), request.micro_batch_sizes, precisions=precisions,
                 framework=request.framework, max_plan_bytes=max_plan_bytes)  # fmt: skip


def layout_name(layout: Layout) -> str:
    pp, dp, cp, tp = layout
    return f"pp{pp}-dp{dp}-tp{tp}" if cp == 1 else f"pp{pp}-dp{dp}-cp{cp}-tp{tp}"
