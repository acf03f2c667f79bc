"""A kernel table read back for pricing (gnn.costs.gpu): what the GPU measured for each operator, by shape.

A table's points are efficiencies at shapes: FLOP/s of a GEMM at (m, k, n), of causal attention at (sequence,
heads, head dim), seconds per element of an element-wise op at its elements (tokens x width), seconds per
parameter of AdamW. Between
points the efficiency is multilinear in the logs of the shape (log space: GEMM efficiency climbs with each width
over decades); beyond the outermost points it holds the edge's efficiency, so time grows with the work. What a
table lacks (another dtype than bf16, a format it did not time, MLA's uneven head dims) falls back to the
datasheet model (gnn.costs.gpu), and ``fallbacks`` says which.
"""

from __future__ import annotations

import itertools
import json
from functools import lru_cache

import numpy as np

from collect import REPO

TABLE_DIR = REPO / "data" / "hardware" / "kernels"
# the table's element-wise op that stands for each kind of work the datasheet model prices by bytes: GELU and an
# eager softmax read and write once, as a norm does; embedding lookups, permutes and quantisation copy
ELEMENTWISE_OPS = {
    "norm": "rms_norm",
    "add": "add",
    "rotary": "rotary",
    "swiglu": "swiglu",
    "gelu": "rms_norm",
    "softmax": "rms_norm",
    "cross_entropy": "cross_entropy",
    "copy": "add",
}
OPTIMIZER_IMPL = "fused"  # Megatron's and NeMo's fused Adam; torch's foreach runs about 2.7x longer on the H100


class LogGrid:
    """A function on a regular grid of positive axes, multilinear in log(axis) and in the stored value."""

    def __init__(self, points: dict[tuple, float]):
        dims = len(next(iter(points)))
        self.axes = [np.array(sorted({p[d] for p in points}), dtype=float) for d in range(dims)]
        self.values = np.full([len(a) for a in self.axes], np.nan)
        for p, v in points.items():
            self.values[tuple(int(np.searchsorted(a, x)) for a, x in zip(self.axes, p))] = v
        if np.isnan(self.values).any():
            raise ValueError(f"a kernel table's grid has {int(np.isnan(self.values).sum())} holes")

    def __call__(self, *x: float) -> float:
        corners = []
        for axis, value in zip(self.axes, x):
            logs = np.log(axis)
            v = float(np.clip(np.log(max(value, 1e-30)), logs[0], logs[-1]))
            i = int(np.clip(np.searchsorted(logs, v) - 1, 0, max(len(axis) - 2, 0)))
            if len(axis) == 1:
                corners.append(((0, 1.0),))
                continue
            t = (v - logs[i]) / (logs[i + 1] - logs[i])
            corners.append(((i, 1 - t), (i + 1, t)))
        total = 0.0
        for combo in itertools.product(*corners):
            weight = float(np.prod([w for _, w in combo]))
            if weight:
                total += weight * self.values[tuple(i for i, _ in combo)]
        return total


class KernelTable:
    """A table's interpolants. Efficiencies are stored as logs so that interpolation is geometric."""

    def __init__(self, record: dict):
        self.id, self.source = record["id"], record["source"]
        cols = record["columns"]
        self.gemm = {fmt: self._gemm(rows, cols["gemm"]) for fmt, rows in record.get("gemm", {}).items() if rows}
        # by kernel (collect.kernels.ops.ATTENTION_BACKENDS): sdpa, flash2, cudnn
        attention = {k: self._attention(rows, cols["attention"]) for k, rows in record.get("attention", {}).items()}
        self.attention = {k: grids for k, grids in attention.items() if grids}
        self.elementwise = self._elementwise(record.get("elementwise", {}).get("bfloat16", []), cols["elementwise"])
        opt = [r for r in record.get("optimizer", {}).get("adamw", []) if r[0] == OPTIMIZER_IMPL]
        self.optimizer = LogGrid({(r[1],): np.log(r[3] / r[1]) for r in opt}) if opt else None

    @staticmethod
    def _gemm(rows, cols) -> tuple[LogGrid, ...]:
        """log FLOP/s of the forward, the input gradient and the weight gradient by (m, k, n)."""
        i = {c: cols.index(c) for c in cols}
        flops = {(r[i["m"]], r[i["k"]], r[i["n"]]): 2.0 * r[i["m"]] * r[i["k"]] * r[i["n"]] for r in rows}
        return tuple(
            LogGrid({key: np.log(flops[key] / r[i[col]]) for key, r in zip(flops, rows)})
            for col in ("forward_s", "dgrad_s", "wgrad_s")
        )

    @staticmethod
    def _attention(rows, cols) -> tuple[LogGrid, LogGrid] | None:
        """log seconds per causal FLOP (2 s^2 h d: half of the unmasked 4 s^2 h d) of the forward and backward."""
        if not rows:
            return None
        i = {c: cols.index(c) for c in cols}
        keys = [(r[i["seq"]], r[i["heads"]], r[i["head_dim"]]) for r in rows]
        flops = [2.0 * s * s * h * d for s, h, d in keys]
        return tuple(
            LogGrid({k: np.log(r[i[col]] / f) for k, r, f in zip(keys, rows, flops)})
            for col in ("forward_s", "backward_s")
        )

    @staticmethod
    def _elementwise(rows, cols) -> dict[str, tuple[LogGrid, LogGrid]]:
        """Per op, log seconds per element of the forward and backward by its elements (tokens x width)."""
        i = {c: cols.index(c) for c in cols}
        by_op: dict[str, dict] = {}
        for r in rows:
            op, n = r[i["op"]], float(r[i["tokens"]] * r[i["width"]])
            by_op.setdefault(op, {}).setdefault(n, []).append((r[i["forward_s"]], r[i["backward_s"]]))
        found = {}
        for op, points in by_op.items():
            med = {n: np.median(np.array(v), axis=0) for n, v in points.items()}  # same elements, other shapes
            found[op] = tuple(LogGrid({(n,): np.log(t[j] / n) for n, t in med.items()}) for j in (0, 1))
        return found

    def gemm_seconds(self, fmt: str, m: float, k: float, n: float, backward: bool) -> float:
        forward, dgrad, wgrad = self.gemm[fmt]
        flops = 2.0 * m * k * n
        if not backward:
            return flops / np.exp(forward(m, k, n))
        return flops / np.exp(dgrad(m, k, n)) + flops / np.exp(wgrad(m, k, n))

    def attention_seconds(
        self, causal_flops: float, seq: float, heads: float, head_dim: float, backward: bool, kernel: str = "sdpa"
    ) -> float:
        return causal_flops * float(np.exp(self.attention[kernel][int(backward)](seq, heads, head_dim)))

    def attention_ratio(self, kernel: str, seq: float, heads: float, head_dim: float, backward: bool) -> float | None:
        """How much longer ``kernel`` runs than torch's own choice (sdpa) at a shape, where both were timed."""
        if kernel not in self.attention or "sdpa" not in self.attention:
            return None
        shape, b = (seq, heads, head_dim), int(backward)
        return float(np.exp(self.attention[kernel][b](*shape) - self.attention["sdpa"][b](*shape)))

    def elementwise_seconds(self, op: str, elements: float, backward: bool) -> float:
        grid = self.elementwise[op][int(backward)]
        return elements * float(np.exp(grid(elements)))

    def optimizer_seconds(self, params: float) -> float:
        return params * float(np.exp(self.optimizer(params)))


@lru_cache(maxsize=8)
def load_table(name: str) -> KernelTable:
    path = TABLE_DIR / f"{name}.json"
    if not path.exists():
        raise ValueError(f"kernels.table {name!r}: no kernel table {path} (collect one: python -m collect.kernels)")
    return KernelTable(json.loads(path.read_text()))
