"""Costs of the GPT's blocks fitted to a fingerprint's block profile (collect.measure.blocks).

Each (block, phase) of the plain model, and each (wrapper, phase) of a whole layer,
gets a non-negative linear cost in what the block does:

    t = c0 + c_flop * FLOPs + c_weight * weight bytes + c_act * activation bytes

fitted to the measured points by least squares on relative error (gnn.costs.analytic.block_features
defines the three quantities, for the profile's sizes and for any plan's blocks alike).
c0 is the block's fixed cost (operator dispatch, autograd, the wrapper's hooks), which
FLOPs over peak miss; the other terms are its throughput at that size. A wrapper's
cost is what it adds to a plain layer at the same size, so wrappers compose by adding
(tensor parallelism's DTensor dispatch plus FSDP's hooks plus checkpointing). The
optimizer costs a fixed amount per parameter tensor and per parameter. The concurrency
points say how many cores the ranks share (gnn.sim.simulate shares them).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from collect.schema import Plan, Workload
from gnn.costs.analytic import block_costs, block_features, dtype_bytes
from gnn.costs.efficiency import relative_nnls

PHASES = ("forward", "backward")
SLOWED = 1.1  # a concurrency ratio above this is ranks sharing cores, not timing noise


def point_features(point: dict) -> np.ndarray:
    """[1, FLOPs, weight bytes, activation bytes] of a profiled block at its size, per rank: a layer measured
    tensor-parallel over ``ranks`` ranks holds its shard (gnn.costs.analytic, as for any plan's blocks)."""
    ranks = point.get("ranks", 1)
    w = Workload(
        layers=1,
        hidden=point["hidden"],
        heads=point["heads"],
        seq_len=point["seq_len"],
        vocab=point["vocab"],
        micro_batch_size=point["batch"],
        global_batch_size=point["batch"],
        dtype=point["dtype"],
    )
    plan = Plan(tp=ranks, sequence_parallel=point["variant"] == "tp_sp") if ranks > 1 else Plan()
    return np.array([1.0, *block_features(block_costs(w, plan), point["block"], dtype_bytes(w))])


class BlockModel:
    def __init__(self, points: list[dict]):
        self.concurrency = _concurrency([p for p in points if p["kind"] == "concurrency"])
        by_key: dict[tuple, list[dict]] = defaultdict(list)
        for p in points:
            if p["kind"] == "block":
                block = p["block"] if p["variant"] == "plain" else "layer"
                by_key[(block, p["variant"], p.get("ranks", 1))].append(p)
        if not any(variant == "plain" for _, variant, _ in by_key):
            raise ValueError("a block profile needs plain block points (collect.measure.blocks)")
        self.coef: dict[tuple[str, str, str], np.ndarray] = {}  # one rank: (block, variant, phase)
        self.group_coef: dict[tuple[str, int, str], np.ndarray] = {}  # a whole pool: (variant, ranks, phase)
        for (block, variant, ranks), pts in by_key.items():
            design = np.stack([point_features(p) for p in pts])
            # a pool's ranks shared its cores while they ran: per rank with a core of its own, as the simulator
            # shares cores itself (gnn.sim.simulate)
            shared = self.concurrency.get(ranks, 1.0)
            for phase in PHASES:
                seconds = np.array([max(p[f"{phase}_s"], 1e-7) for p in pts]) / shared
                coef = relative_nnls(design, seconds)
                if ranks == 1:
                    self.coef[(block, variant, phase)] = coef
                else:
                    self.group_coef[(variant, ranks, phase)] = coef
        self.optimizer = self._fit_optimizer([p for p in points if p["kind"] == "optimizer"])

    @staticmethod
    def _fit_optimizer(points: list[dict]) -> dict[str, np.ndarray]:
        by_variant = defaultdict(list)
        for p in points:
            by_variant[p["variant"]].append(p)
        return {
            v: relative_nnls(
                np.array([[p["tensors"], p["params"]] for p in pts], dtype=float), np.array([p["step_s"] for p in pts])
            )
            for v, pts in by_variant.items()
        }

    def rescale_flops(self, ratio: float) -> "BlockModel":
        """Scale the fitted per-FLOP costs by ``ratio``: a profile borrowed from another machine, by the ratio of
        the two machines' measured fp32 matmul throughput. Fixed and per-byte costs stay: a one-copy bandwidth
        reading moved the byte costs the wrong way on the CPU rows (a 64 MB copy read 1.6-2.2x faster on the
        profiling machine, while its wide blocks were not), and nothing measured says how dispatch differs."""
        for coef in (*self.coef.values(), *self.group_coef.values()):
            coef[1] *= ratio
        return self

    def seconds(self, block: str, variant: str, phase: str, features) -> float:
        """Fitted seconds of a (block, variant, phase) at ``features`` = (FLOPs, weight bytes, activation bytes)."""
        return float(self.coef[(block, variant, phase)] @ np.array([1.0, *features]))

    def wrapper_seconds(self, variant: str, phase: str, features) -> float:
        """What a wrapper adds to a plain layer's phase at this size (may be negative: a checkpointed forward
        keeps nothing for backward and runs faster)."""
        key = ("layer", variant, phase)
        if key not in self.coef:
            return 0.0
        return self.seconds("layer", variant, phase, features) - self.seconds("layer", "plain", phase, features)

    def group_seconds(self, variant: str, ranks: int, phase: str, features) -> float | None:
        """A layer's seconds tensor-parallel over ``ranks`` real ranks, collectives included (None: not
        measured at that group size)."""
        coef = self.group_coef.get((variant, ranks, phase))
        return None if coef is None else float(coef @ np.array([1.0, *features]))

    def optimizer_seconds(self, variant: str, tensors: float, params: float) -> float:
        coef = self.optimizer.get(variant)
        if coef is None:
            coef = self.optimizer.get("plain", np.zeros(2))
        return float(coef @ np.array([tensors, params]))

    @property
    def cores(self) -> float:
        """Cores the ranks share, from the concurrency points: r ranks computing at once ran s(r) times slower
        than one, so r / s(r) cores (the smallest over the world sizes that slowed down; 4 gloo ranks on this
        2-core machine: 4 / 2.19 = 1.83). inf when no world size slowed down."""
        slowed = [r / s for r, s in self.concurrency.items() if s > SLOWED]
        return min(slowed) if slowed else float("inf")


def _concurrency(points: list[dict]) -> dict[int, float]:
    """{ranks: median over sizes of (time with that many ranks computing) / (time alone)}."""
    alone = {(p["hidden"], p["seq_len"], p["batch"]): p["time_s"] for p in points if p["ranks"] == 1}
    ratios = defaultdict(list)
    for p in points:
        size = (p["hidden"], p["seq_len"], p["batch"])
        if p["ranks"] > 1 and size in alone:
            ratios[p["ranks"]].append(p["time_s"] / alone[size])
    return {1: 1.0, **{r: max(1.0, float(np.median(v))) for r, v in ratios.items()}}
