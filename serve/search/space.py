"""The plan space of one (workload, cluster, global batch): every valid plan, or one chosen by name.

A plan here fixes dp x tp x pp (their product is the world size), sharding,
recompute, pipeline schedule (and virtual stages), sequence parallel, and the
micro-batch size and count (dp x micro_batch_size x num_microbatches = the
global batch). Only combinations the schema accepts (plan_problems) exist.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import cached_property

from collect.schema import PIPELINE_SCHEDULES, RECOMPUTES, SHARDINGS, Cluster, Plan, RunSpec, Workload, plan_problems
from collect.sweep import layouts
from serve.schemas import limit_problems


@dataclass(frozen=True)
class Space:
    workload: Workload  # its micro_batch_size is replaced by each plan's own
    cluster: Cluster
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    virtual_stages: tuple[int, ...] = (2,)
    shardings: tuple[str, ...] = SHARDINGS
    recomputes: tuple[str, ...] = RECOMPUTES
    schedules: tuple[str, ...] = PIPELINE_SCHEDULES
    max_tp: int = field(default=8)

    @property
    def global_batch_size(self) -> int:
        return self.workload.global_batch_size

    def layouts(self) -> list[tuple[int, int, int]]:
        """(pp, dp, tp) with tp within a node: tensor parallelism across nodes is never the fast choice."""
        return self._layouts

    @cached_property
    def _layouts(self) -> list[tuple[int, int, int]]:
        limit = min(self.max_tp, self.cluster.devices_per_node)
        return [lay for lay in layouts(self.cluster.world_size) if lay[2] <= limit]

    @cached_property
    def layouts_by_name(self) -> dict[str, tuple[int, int, int]]:
        """The layouts as the search's categorical choices, computed once per space, not once per trial."""
        return {f"pp{pp}-dp{dp}-tp{tp}": (pp, dp, tp) for pp, dp, tp in self.layouts()}

    def spec(
        self,
        pp: int,
        dp: int,
        tp: int,
        mbs: int,
        sharding: str,
        recompute: str,
        schedule: str | None,
        virtual: int,
        sp: bool,
    ) -> RunSpec | None:
        """The RunSpec of one choice, or None if the choice is not a valid plan."""
        samples = dp * mbs
        if self.global_batch_size % samples:
            return None
        w = self.workload.model_copy(update={"micro_batch_size": mbs})
        p = Plan.model_construct(
            dp=dp,
            tp=tp,
            pp=pp,
            sharding=sharding,
            recompute=recompute,
            pp_schedule=schedule if pp > 1 else None,
            virtual_stages=virtual if pp > 1 else 1,
            num_microbatches=self.global_batch_size // samples,
            sequence_parallel=sp,
        )
        if limit_problems(p) or plan_problems(w, p, self.cluster):
            return None
        return RunSpec.model_construct(workload=w, plan=p, cluster=self.cluster)

    def enumerate(self) -> list[RunSpec]:
        """Every valid plan of the space (computed once per space)."""
        return self._plans

    @cached_property
    def _plans(self) -> list[RunSpec]:
        out = []
        for (pp, dp, tp), mbs, sharding, recompute in itertools.product(
            self.layouts(), self.micro_batch_sizes, self.shardings, self.recomputes
        ):
            schedules = (
                [(None, 1)]
                if pp == 1
                else [
                    (s, v) for s in self.schedules for v in (self.virtual_stages if s == "interleaved_1f1b" else (1,))
                ]
            )
            for (schedule, virtual), sp in itertools.product(schedules, (False, True) if tp > 1 else (False,)):
                spec = self.spec(pp, dp, tp, mbs, sharding, recompute, schedule, virtual, sp)
                if spec is not None:
                    out.append(spec)
        return out
