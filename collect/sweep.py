"""Sweep specs: which (workload, plan, cluster) points to measure, in what order.

A sweep YAML either lists explicit ``points`` or describes a plan space that a
sampler draws from (``grid``: every valid point; ``random``: a seeded sample,
balanced over world sizes; ``active``: chosen a batch at a time by a surrogate
within a budget, collect.active). Invalid combinations are filtered out through the
schema's own ``plan_problems``, so only runnable plans are emitted. A random
fraction of points is repeated, the repeats spread over the sweep, to measure
the noise floor. Precedence: CLI flags > sweep YAML > SweepSpec defaults.
"""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, Field, model_validator

from collect.inputs import InputError, read_text
from collect.measure.plan import MeasureSettings
from collect.schema import (
    PIPELINE_SCHEDULES,
    RECOMPUTES,
    SHARDINGS,
    Cluster,
    Family,
    PipelineSchedule,
    Plan,
    Recompute,
    RunSpec,
    Sharding,
    Workload,
    collect_problems,
    plan_problems,
)


class Shape(BaseModel, extra="forbid"):
    """A model without its batch (the sampler chooses batch sizes): Workload's fields, of any family."""

    family: Family = "gpt"
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    dtype: str = "float32"
    kv_heads: int | None = None
    head_dim: int | None = None
    ffn_hidden: int | None = None
    tied_embeddings: bool = False
    experts: int | None = None
    top_k: int | None = None
    expert_ffn_hidden: int | None = None
    shared_experts: int = 0
    first_dense_layers: int = 0
    moe_every: int = 1
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None

    def workload(self, micro_batch_size: int, global_batch_size: int) -> Workload:
        # only what the YAML gave: a gpt shape must not pass llama fields, even at their defaults
        fields = self.model_dump(exclude_unset=True)
        return Workload(**fields, micro_batch_size=micro_batch_size, global_batch_size=global_batch_size)


class SweepSpec(BaseModel):
    name: str
    """Sweep id; results go to data/runs/<name>.parquet."""
    points: list[RunSpec] = []
    """Explicit points; when given, the space below is not sampled."""
    shapes: list[Shape] = []
    world_sizes: list[int] = [1, 2, 4]
    tp_degrees: list[int] = [1, 2, 4, 8]
    """Tensor-parallel degrees allowed in the sampled layouts."""
    pp_degrees: list[int] | None = None
    """Pipeline degrees allowed in the sampled layouts; None: every one the world size divides into."""
    ep_degrees: list[int] = [1]
    """Expert-parallel degrees tried on moe shapes (ep borrows dp's ranks, so it adds no layout)."""
    micro_batch_sizes: list[int] = [1, 2]
    num_microbatches: list[int] = [1, 2, 4]
    shardings: list[Sharding] = list(SHARDINGS)
    recomputes: list[Recompute] = list(RECOMPUTES)
    pp_schedules: list[PipelineSchedule] = list(PIPELINE_SCHEDULES)
    virtual_stages: list[int] = [2]
    sequence_parallel: list[bool] = [False, True]
    memory_bytes: list[int] = [2**30]
    """Per-device capacities to draw from; small ones make oom labels."""
    device: Literal["cpu", "cuda"] = "cpu"
    backend: Literal["gloo", "nccl"] = "gloo"
    device_kind: str = "cpu"
    devices_per_node: int | None = None
    """GPUs per node on a cluster; None puts every world size on one node."""
    sampler: Literal["grid", "random", "active"] = "random"
    num_points: int = 100
    """Points drawn by the random sampler (before repeats)."""
    budget_device_hours: float | None = Field(default=None, gt=0)
    """Active sampler: stop once the measured plans (not the check set) have used this many device-hours."""
    budget_runs: int | None = Field(default=None, ge=1)
    """Active sampler: stop after this many measured plans (not counting the check set)."""
    target_mape: float | None = Field(default=None, gt=0)
    """Active sampler: stop early once the surrogate's time MAPE on the check set is at most this (0.1 = 10%)."""
    check_runs: int = Field(default=24, ge=2)
    """Active sampler: random plans measured first and never learned from, the held-out check set."""
    seed_runs: int = Field(default=16, ge=2)
    """Active sampler: random plans measured before the surrogate chooses."""
    batch_size: int = Field(default=8, ge=1)
    """Active sampler: plans measured between two fits of the surrogate."""
    acquisition: Literal["active", "uncertainty", "random"] = "active"
    """Active sampler: how a batch is chosen (collect.active.select_batch); ``random`` is the baseline."""
    seed: int = 0
    skip_traced_by: list[str] = []
    """Fake sweeps (collect.fake.sweep): other sweeps of the same output folder whose traced plans this one does not
    trace again, so that a second seeded draw of a space adds only new plans. A sweep renamed to trace again after a
    fix names none."""
    repeat_fraction: float = Field(default=0.1, ge=0, le=1)
    repeat_count: int = Field(default=3, ge=2)
    """Total measurements of each repeated point."""
    repeat_order: Literal["spread", "rounds"] = "spread"
    """``spread``: each repeat at a random later position. ``rounds``: the repeated points are measured in
    ``repeat_count`` rounds, every point once per round in a new order, so that a drift in the machine's speed
    (tens of percent within minutes on a shared VM) falls on all of them alike, not on whichever ran late."""
    reference_every: int = 30
    """Re-measure the world size's reference plan after this many plans on it."""
    deadline_s: float = 300.0
    measure: MeasureSettings = MeasureSettings()
    profile_blocks: bool = True
    """Take the block profile (collect.measure.blocks) with the sweep's fingerprint: ~1 min here, and what the simulator
    prices compute with. Off only for sweeps whose times no model reads (the project's own tests)."""

    @model_validator(mode="after")
    def _active_has_a_budget(self) -> "SweepSpec":
        if self.sampler == "active" and self.budget_device_hours is None and self.budget_runs is None:
            raise ValueError("sampler: active needs a budget: budget_device_hours or budget_runs")
        return self

    @classmethod
    def from_yaml(cls, path: str | Path) -> "SweepSpec":
        text = read_text(path)  # the encodings and size limit of every other file the commands read
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
            raise InputError(f"error: {path} is not valid YAML: {getattr(e, 'problem', None) or e}{where}") from None
        except RecursionError:
            raise InputError(f"error: {path} is nested too deeply to be a sweep") from None
        return cls.model_validate(data)


def divisors(n: int) -> list[int]:
    """The divisors of n in ascending order, in O(sqrt(n))."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def layouts(world_size: int) -> list[tuple[int, int, int]]:
    """Every (pp, dp, tp) with pp * dp * tp = world_size, pp then dp ascending: divisors of divisors, so 16,384
    GPUs take microseconds (a double loop over every count was quadratic: 2 s at 4,096)."""
    return [(pp, dp, world_size // (pp * dp)) for pp in divisors(world_size) for dp in divisors(world_size // pp)]


def valid_points(spec: SweepSpec, world_size: int) -> list[RunSpec]:
    points = []
    allowed = [
        lay
        for lay in layouts(world_size)
        if lay[2] in spec.tp_degrees and (spec.pp_degrees is None or lay[0] in spec.pp_degrees)
    ]
    for shape, (pp, dp, tp), mbs, nmb, capacity in itertools.product(
        spec.shapes, allowed, spec.micro_batch_sizes, spec.num_microbatches, spec.memory_bytes
    ):
        workload = shape.workload(micro_batch_size=mbs, global_batch_size=dp * mbs * nmb)
        per_node = min(world_size, spec.devices_per_node or world_size)
        cluster = Cluster(
            nodes=world_size // per_node,
            devices_per_node=per_node,
            memory_bytes=capacity,
            device=spec.device,
            backend=spec.backend,
            device_kind=spec.device_kind,
        )
        for plan_fields in _plan_variants(spec, pp, dp, tp, nmb, workload.family == "moe"):
            plan = Plan(**plan_fields)
            if not plan_problems(workload, plan, cluster) and not collect_problems(workload, plan, cluster):
                points.append(RunSpec.model_construct(workload=workload, plan=plan, cluster=cluster))
    return points


def _plan_variants(spec: SweepSpec, pp: int, dp: int, tp: int, nmb: int, moe: bool):
    schedules = (
        [(None, 1)]
        if pp == 1
        else [(s, v) for s in spec.pp_schedules for v in ([1] if s != "interleaved_1f1b" else spec.virtual_stages)]
    )
    sps = spec.sequence_parallel if tp > 1 else [False]
    eps = [ep for ep in spec.ep_degrees if dp % ep == 0] if moe else [1]
    variants = itertools.product(spec.shardings, spec.recomputes, schedules, sps, eps)
    for sharding, recompute, (schedule, vs), sp, ep in variants:
        yield dict(
            pp=pp,
            dp=dp,
            tp=tp,
            sharding=sharding,
            recompute=recompute,
            pp_schedule=schedule,
            virtual_stages=vs,
            num_microbatches=nmb,
            sequence_parallel=sp,
            ep=ep,
        )


def sample_points(spec: SweepSpec) -> list[RunSpec]:
    if spec.points:
        return list(spec.points)
    if spec.sampler == "active":
        raise ValueError("an active sweep has no schedule: collect.active chooses its plans as it goes")
    rng = random.Random(spec.seed)
    by_world = {ws: valid_points(spec, ws) for ws in spec.world_sizes}
    if spec.sampler == "grid":
        return [p for pts in by_world.values() for p in pts]
    per_world = max(1, spec.num_points // len(by_world))
    chosen = []
    for pts in by_world.values():
        chosen += sample_by_layout(pts, per_world, rng)
    return chosen


def all_points(spec: SweepSpec) -> list[RunSpec]:
    """Every valid point of the space, over every world size."""
    return [p for ws in spec.world_sizes for p in valid_points(spec, ws)]


def sample_by_layout(points: list[RunSpec], n: int, rng: random.Random) -> list[RunSpec]:
    """Draw a (pp, dp, tp, ep) layout uniformly, then a point within it, without replacement.

    Uniform over points would over-weight tensor parallelism, whose layouts have
    the most variants (sequence parallel doubles them) and are the slowest to run; and
    expert parallelism, which only moe shapes with FSDP have, would be rare.
    """
    by_layout: dict[tuple, list[RunSpec]] = {}
    for p in points:
        by_layout.setdefault((p.plan.pp, p.plan.dp, p.plan.tp, p.plan.ep), []).append(p)
    pools = {k: rng.sample(v, len(v)) for k, v in sorted(by_layout.items())}
    chosen = []
    while len(chosen) < n and pools:
        layout = rng.choice(sorted(pools))
        chosen.append(pools[layout].pop())
        if not pools[layout]:
            del pools[layout]
    return chosen


def schedule_measurements(spec: SweepSpec) -> list[tuple[RunSpec, int, str | None]]:
    """(point, repeat_index, repeat_group) in run order: shuffled, repeats spread out or in rounds."""
    rng = random.Random(spec.seed + 1)
    points = sample_points(spec)
    rng.shuffle(points)
    repeated = set(rng.sample(range(len(points)), round(spec.repeat_fraction * len(points))))
    order = [(p, 0, p.run_id if i in repeated else None) for i, p in enumerate(points)]
    if spec.repeat_order == "rounds":
        for k in range(1, spec.repeat_count):
            again = [points[i] for i in sorted(repeated)]
            rng.shuffle(again)
            order += [(p, k, p.run_id) for p in again]
        return order
    for i in sorted(repeated):
        for k in range(1, spec.repeat_count):
            # later in the sweep than the first measurement, at a random position
            first = next(j for j, item in enumerate(order) if item[0] is points[i])
            order.insert(rng.randint(first + 1, len(order)), (points[i], k, points[i].run_id))
    return order


def measurement_id(point: RunSpec, repeat_index: int) -> str:
    return f"{point.run_id}-r{repeat_index}"
