"""Where a pipeline schedule places its passes: which pass runs on which rank, in what order, after which others.

A layout depends only on the pipeline's shape (pp, schedule, virtual stages, micro-batches) and on which FSDP
mode decides the pass variants, not on the model or the hardware. Many plans of a search share a shape, so
layouts are computed once and cached, and building a graph is then a few numpy gathers (gnn.graph.build).

Passes are named by template keys: (phase, first stage?, last stage?, layers, variant...) for forward ("F") and
backward ("B") passes, where layers is the stage's layer count when stages differ (Plan.stage_layers) and 0
otherwise, and ("S", stages held) for a rank's optimizer step. A key's representative says which
stage and micro-batch to compile the template from (gnn.graph.passes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from collect.schema import Plan, Workload
from gnn import cancel
from gnn.graph.schedule import rank_orders


@dataclass(frozen=True)
class Layout:
    representatives: list[tuple]  # per distinct template: ("F" | "B", stage, variant) or ("S", held stages)
    kind: np.ndarray  # [passes] index into representatives, in build order (every dependency comes first)
    rank: np.ndarray  # [passes]
    stage: np.ndarray  # [passes]
    microbatch: np.ndarray  # [passes], -1 for steps
    dep_src: np.ndarray  # pass whose end node ...
    dep_dst: np.ndarray  # ... the first node of this pass waits for
    passes_of: list[np.ndarray]  # per distinct template, the passes that place it
    phase: np.ndarray  # [passes] 0 forward, 1 backward, 2 optimizer step (gnn.graph.table.PASS_PHASES)
    edge_index: np.ndarray  # [2, edges] the pass graph: dependencies, then each rank's order of passes
    edge_kind: np.ndarray  # [edges] 0 dependency, 1 order (gnn.graph.table.EDGE_KINDS)
    key: tuple = ()  # what plan_layout caches it by


CACHE_SIZE = 4096
# and at most this many passes in all (~150 bytes each): a pipeline of 256 stages holds 10^5 passes or more,
# and a server caching 4,096 of those grew past 6 GiB
CACHE_PASSES = 100_000
# a stop is looked for every this many passes laid out (~10 ms of a 10^5-pass pipeline's layout)
CHECK_EVERY = 4096
_CACHE: dict[tuple, Layout] = {}


def plan_layout(plan: Plan, uneven: tuple[int, ...] | None = None) -> Layout:
    """``uneven``: each stage's layer count where they differ (``uneven_layers``)."""
    schedule = plan.pp_schedule if plan.pp > 1 else None
    key = (plan.pp, schedule, plan.virtual_stages, plan.num_microbatches, _fsdp(plan), uneven)
    found = _CACHE.get(key)
    if found is None:
        found = replace(_layout(plan, uneven), key=key)
        cache_bounded(_CACHE, key, found, len(found.kind), CACHE_SIZE, CACHE_PASSES)
    return found


def cache_bounded(cache: dict, key, value, size: int, max_entries: int, max_size: int) -> None:
    """Put ``value`` in ``cache`` unless it alone is over a quarter of ``max_size``; clear the cache first when it
    would hold more than ``max_entries`` entries or ``max_size`` in all (sizes kept under the key None): a search's
    shapes number in the tens, and a huge one is built once."""
    if size * 4 > max_size:
        return
    if len(cache) >= max_entries or cache.get(None, 0) + size > max_size:
        cache.clear()
    cache[key] = value
    cache[None] = cache.get(None, 0) + size


def uneven_layers(plan: Plan, w: Workload) -> tuple[int, ...] | None:
    """Each stage's layer count when they differ, else None (then every middle stage runs the same passes)."""
    counts = plan.stage_layers(w.layers, w.pipeline_costs)
    return counts if len(set(counts)) > 1 else None


def stage_role(stage: int, last_stage: int, uneven: tuple[int, ...] | None) -> tuple[bool, bool, int]:
    """What a stage's passes depend on of its place in the pipeline: first?, last?, and its layers if they differ."""
    return stage == 0, stage == last_stage, uneven[stage] if uneven else 0


def _fsdp(plan: Plan) -> str | None:
    return plan.sharding if plan.fsdp_enabled else None


def variant(phase: str, mb: int, num_microbatches: int, pp: int, fsdp: str | None) -> tuple[bool, ...]:
    """What distinguishes one micro-batch's pass from another's: forward, whether it gathers FSDP parameters;
    backward, whether it is the first (allocates the gradients) and whether it frees grad_op's gathered ones."""
    first, last = mb == 0, mb == num_microbatches - 1
    # grad_op keeps parameters gathered across a pipeline's micro-batches; without pp the trainer reshards after
    # each backward, so every micro-batch gathers again (and frees at its own backward)
    if phase == "F":
        return (fsdp == "fsdp_full" or (fsdp == "fsdp_grad_op" and (first or pp == 1)),)
    return first, fsdp == "fsdp_grad_op" and (pp == 1 or last)


def _layout(plan: Plan, uneven: tuple[int, ...] | None) -> Layout:
    orders, last_stage = rank_orders(plan), plan.num_stages - 1
    pp, num_microbatches, fsdp = plan.pp, plan.num_microbatches, _fsdp(plan)
    index: dict[tuple, int] = {}
    representatives, rows, deps = [], [], []
    position: dict[tuple[str, int, int], int] = {}  # (phase, stage, mb) -> pass number

    def place(key: tuple, representative: tuple, rank: int, stage: int, mb: int, needs: list[int]) -> int:
        if key not in index:
            index[key] = len(representatives)
            representatives.append(representative)
        rows.append((index[key], rank, stage, mb))
        deps.extend((need, len(rows) - 1) for need in needs)
        return len(rows) - 1

    previous: dict[int, int] = {}  # rank -> the pass it placed last
    for n, (rank, phase, stage, mb) in enumerate(global_order(orders)):
        if n % CHECK_EVERY == 0:
            cancel.check("laying out a pipeline")
        var = variant(phase, mb, num_microbatches, pp, fsdp)
        needs = (
            ([("F", stage - 1, mb)] if stage > 0 else [])
            if phase == "F"
            else ([("F", stage, mb)] + ([("B", stage + 1, mb)] if stage < last_stage else []))
        )
        key = (phase, *stage_role(stage, last_stage, uneven), *var)
        waits = [position[n] for n in needs if n in position]
        # FSDP gathers when the rank's program reaches the pass (its pre-forward and pre-backward hooks): without
        # this edge only the collective stream's order would hold a gather back, and at dp = 1, with no
        # reduce-scatters between them, every micro-batch's gather would start at once
        if _gathers_first(phase, var, fsdp) and rank in previous and previous[rank] not in waits:
            waits.append(previous[rank])
        position[(phase, stage, mb)] = previous[rank] = place(key, (phase, stage, var), rank, stage, mb, waits)
    for rank, order in enumerate(orders):
        held = tuple(sorted({s for _, s, _ in order}))
        last_backward = [max(m for p, st, m in order if st == s and p == "B") for s in held]
        place(("S", held), ("S", held), rank, held[0], -1, [position[("B", s, m)] for s, m in zip(held, last_backward)])
    table = np.array(rows, dtype=np.int64).reshape(-1, 4)
    dep = np.array(deps, dtype=np.int64).reshape(-1, 2)
    kind, rank = table[:, 0].copy(), table[:, 1].copy()
    phase = np.array(["FBS".index(rep[0]) for rep in representatives], dtype=np.int64)[kind]
    edge_index, edge_kind = with_kinds(dep.T, chain(rank))  # each rank runs its passes in build order
    return Layout(
        representatives,
        kind,
        rank,
        table[:, 2].copy(),
        table[:, 3].copy(),
        dep[:, 0].copy(),
        dep[:, 1].copy(),
        [np.flatnonzero(kind == i) for i in range(len(representatives))],
        phase,
        edge_index,
        edge_kind,
    )


def _gathers_first(phase: str, var: tuple[bool, ...], fsdp: str | None) -> bool:
    """Whether the pass opens with an FSDP all-gather (gnn.graph.passes: gathering forwards, fsdp_full backwards)."""
    return (phase == "F" and var[0]) or (phase == "B" and fsdp == "fsdp_full")


def chain(key: np.ndarray) -> np.ndarray:
    """[2, k] edges from each item to the next one with the same key, in their order."""
    idx = np.argsort(key, kind="stable")
    same = key[idx[1:]] == key[idx[:-1]]
    return np.stack([idx[:-1][same], idx[1:][same]]).astype(np.int64)


def with_kinds(data: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Data edges then order edges, and their kinds (0 data, 1 order: gnn.graph.table.EDGE_KINDS)."""
    kinds = np.concatenate([np.zeros(data.shape[1], np.int64), np.ones(order.shape[1], np.int64)])
    return np.concatenate([data, order], axis=1).astype(np.int64), kinds


def global_order(orders):
    """Interleave the ranks' programs so every pass comes after the passes it needs."""
    done, cursors, out = set(), [0] * len(orders), []
    num_stages = max(s for order in orders for _, s, _ in order) + 1
    while len(out) < sum(map(len, orders)):
        cancel.check("ordering a pipeline's passes")  # once per sweep over the ranks
        progressed = False
        for rank, order in enumerate(orders):
            while cursors[rank] < len(order):
                phase, stage, mb = order[cursors[rank]]
                need = (
                    ("F", stage - 1, mb)
                    if phase == "F" and stage > 0
                    else (("B", stage + 1, mb) if phase == "B" and stage < num_stages - 1 else ("F", stage, mb))
                )
                if phase == "F" and stage == 0:
                    need = None
                if need is not None and need not in done:
                    break
                done.add((phase, stage, mb))
                out.append((rank, phase, stage, mb))
                cursors[rank] += 1
                progressed = True
        if not progressed:
            waiting = [o[c] if c < len(o) else None for o, c in zip(orders, cursors)]
            raise ValueError(f"pipeline schedule deadlocks: {waiting}")
    return out


def clear_layouts() -> None:
    _CACHE.clear()
