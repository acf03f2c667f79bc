"""The plan space of one (workload, cluster, global batch): every valid plan, or one chosen by name.

A plan here fixes dp x cp x tp x pp (their product is the world size), sharding,
recompute, pipeline schedule (and virtual stages), sequence parallel, the
micro-batch size and count (dp x micro_batch_size x num_microbatches = the
global batch), the expert-parallel degree of a moe model (borrowed from dp x cp, and
from tp where the experts stay whole: etp 1 beside the experts split as the MLP,
etp = tp) and, on GPUs with FP8 matmuls, the precision (bfloat16, or FP8 with
tensorwise or rowwise scaling, tensorwise under FSDP perhaps all-gathering in FP8;
Blackwell's MXFP8 and NVFP4 too), and the conventions of the framework named
(loss sharded over tp, what the pipeline keeps). Only combinations
the schema accepts (plan_problems) exist, and, for a space whose plans are to be
measured here, only those the collector runs (collect_problems).
"""

from __future__ import annotations

import itertools
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
from serve.schemas import limit_problems

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
    # filled as the space is walked: validity per key (spec), the workload per micro-batch size and precision
    _valid: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _workloads: dict = field(default_factory=dict, init=False, repr=False, compare=False)

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
        self,
        layout: Layout,
        mbs: int,
        sharding: str,
        recompute: str,
        schedule: str | None,
        virtual: int,
        sp: bool,
        ep: int = 1,
        float8: str | None = None,
        float8_all_gather: bool = False,
        etp: int | None = None,
    ) -> RunSpec | None:
        """The RunSpec of one choice, or None if the choice is not a valid plan."""
        pp, dp, cp, tp = layout
        samples = dp * mbs
        if self.global_batch_size % samples:
            return None
        # whether a plan is valid does not depend on its sharding or recompute (plan_problems reads sharding only
        # for float8_all_gather, part of the key): checked once per key, not once per sharding and recompute
        key = (layout, mbs, schedule, virtual, sp, ep, float8, float8_all_gather, etp)
        if self._valid.get(key) is False:
            return None
        w = self._workload(mbs, float8)
        p = Plan.model_construct(
            dp=dp,
            cp=cp,
            tp=tp,
            pp=pp,
            ep=ep,
            etp=etp,
            sharding=sharding,
            recompute=recompute,
            pp_schedule=schedule if pp > 1 else None,
            virtual_stages=virtual if pp > 1 else 1,
            num_microbatches=self.global_batch_size // samples,
            sequence_parallel=sp,
            float8_all_gather=float8_all_gather,
            **framework_conventions(self.framework, tp, sp, w.dtype),
        )
        valid = self._valid.get(key)
        if valid is None:
            valid = self._valid[key] = not (limit_problems(p) or plan_problems(w, p, self.cluster))
        if not valid:
            return None
        if self.collectable_only and collect_problems(w, p, self.cluster):
            return None
        return RunSpec.model_construct(workload=w, plan=p, cluster=self.cluster)

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

    def iter_plans(self, should_stop=None) -> Iterator[RunSpec]:
        """The valid plans of the space, in enumerate()'s order, one at a time. ``should_stop`` is asked every
        STOP_CHECK_EVERY candidates (a few ms): SpaceStopped is raised when it answers True."""
        for n, choice in enumerate(self._choices()):
            if should_stop is not None and n % STOP_CHECK_EVERY == 0 and should_stop():
                raise SpaceStopped(f"the plan space's enumeration stopped after {n} candidates")
            spec = self.spec(*choice)
            if spec is not None:
                yield spec

    def count(self, limit: int | None = None, should_stop=None) -> int:
        """How many plans the space holds, or limit + 1 once it is known to hold more than ``limit``; without
        building them where validity is already known (about a microsecond a candidate)."""
        n = 0
        for i, choice in enumerate(self._choices()):
            if should_stop is not None and i % STOP_CHECK_EVERY == 0 and should_stop():
                raise SpaceStopped(f"the plan space's count stopped after {i} candidates")
            n += self._is_valid(choice)
            if limit is not None and n > limit:
                break
        return n

    def _is_valid(self, choice: tuple) -> bool:
        layout, mbs, _, _, schedule, virtual, sp, ep, f8, gather, etp = choice
        key = (layout, mbs, schedule, virtual, sp, ep, f8, gather, etp)
        known = None if self.collectable_only else self._valid.get(key)
        return known if known is not None else self.spec(*choice) is not None

    def _choices(self) -> Iterator[tuple]:
        for layout, mbs, sharding, recompute in itertools.product(
            self.layouts(), self.micro_batch_sizes, self.shardings, self.recomputes
        ):
            pp, dp, cp, tp = layout
            if self.global_batch_size % (dp * mbs):
                continue  # no plan of this layout and micro-batch size fills the batch
            schedules = (
                [(None, 1)]
                if pp == 1
                else [
                    (s, v) for s in self.schedules for v in (self.virtual_stages if s == "interleaved_1f1b" else (1,))
                ]
            )
            for (schedule, virtual), sp, (etp, ep), (f8, gather) in itertools.product(
                schedules,
                (False, True) if tp > 1 else (False,),
                self.expert_layouts(layout),
                self.precision_choices(sharding),
            ):
                yield layout, mbs, sharding, recompute, schedule, virtual, sp, ep, f8, gather, etp

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


class SpaceStopped(RuntimeError):
    """An enumeration of the plan space was told to stop."""


def layout_name(layout: Layout) -> str:
    pp, dp, cp, tp = layout
    return f"pp{pp}-dp{dp}-tp{tp}" if cp == 1 else f"pp{pp}-dp{dp}-cp{cp}-tp{tp}"
