"""A pass as table rows: the rows being written (PassRows) and the finished template (PassTemplate).

gnn.graph.passes compiles each distinct pass of a plan once into a PassTemplate; gnn.graph.build repeats its
rows wherever the schedule places the pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnn.costs.pricing import Pricing
from gnn.graph.table import COL, COLUMNS, KINDS, table_row

_GATHER = KINDS.index("fsdp_allgather")


@dataclass
class PassTemplate:
    table: np.ndarray  # [nodes, COLUMNS]
    edges: np.ndarray  # [2, k] data dependencies inside the pass, local indices
    end: int  # local index of the node that ends the pass (what later passes depend on)
    grads_at: int = -1  # a backward: the node that allocates the gradients when it is a stage's first
    kept_bytes: float = 0.0  # what its nodes allocate and keep, FSDP's gathers aside: a forward's activations
    # what placing the pass depends on (gnn.graph.build caches the placement by it): its size, its nodes' streams and
    # its edges, not its costs. Computed unless given (a copy with other costs has its original's).
    shape: tuple | None = None

    def __post_init__(self):
        if self.shape is None:
            self.shape = (len(self.table), self.table[:, COL["stream"]].tobytes(), self.edges.tobytes(), self.end)


def led_by(template: PassTemplate, row: list) -> PassTemplate:
    """``template`` with ``row`` (a table_row) first: it takes the pass's outside dependencies and precedes the
    rest."""
    table = np.vstack([np.asarray(row, dtype=np.float64)[None, :], template.table])
    edges = np.concatenate([np.array([[0], [1]], dtype=np.int64), template.edges + 1], axis=1)
    grads_at = template.grads_at + 1 if template.grads_at >= 0 else -1
    return PassTemplate(table, edges, template.end + 1, grads_at, template.kept_bytes)


class PassRows:
    """Rows of one pass in order, with their data dependencies; the first row takes the pass's outside ones.
    Rows are lists in COLUMNS order (rank and micro-batch 0: gnn.graph.build writes where each pass is placed), not
    Node objects: a plan compiles ~5 passes of ~5 rows, and an object per row cost a fifth of featurising."""

    def __init__(self, pricing: Pricing):
        self.pricing, self.rows, self.sources, self.targets = pricing, [], [], []
        self.held = 0.0  # bytes the pass allocates for the rest of the iteration, not for its backward to free

    def add(
        self,
        after: int | None,
        kind: str,
        phase: str,
        stage: int,
        *,
        count: int = 1,
        flops: float = 0.0,
        message_bytes: float = 0.0,
        group: int = 1,
        crosses_node: bool = False,
        alloc_bytes: float = 0.0,
        transient_bytes: float = 0.0,
        seconds: float | None = None,
    ) -> int:
        """A node after node ``after`` (None: the pass's first); returns its index. Fields as gnn.graph.build.Node;
        ``seconds``: its cost, when the caller prices it (otherwise the pricing's estimate)."""
        est = (
            seconds
            if seconds is not None
            else self.pricing.estimate(kind, phase, count, flops, message_bytes, group, crosses_node)
        )
        self.rows.append(
            table_row(
                kind,
                phase,
                0,
                stage,
                0,
                count,
                flops,
                message_bytes,
                group,
                crosses_node,
                alloc_bytes,
                0.0,
                transient_bytes,
                est,
            )
        )
        if after is not None:
            self.sources.append(after)
            self.targets.append(len(self.rows) - 1)
        return len(self.rows) - 1

    def set(self, index: int, column: str, value: float) -> None:
        self.rows[index][COL[column]] = value

    def keep(self, index: int, nbytes: float) -> None:
        """Row ``index`` also allocates ``nbytes`` the pass keeps, freed by its backward as its activations are."""
        self.rows[index][COL["alloc_bytes"]] += nbytes

    def hold(self, index: int, nbytes: float) -> None:
        """Row ``index`` also allocates ``nbytes`` that stay live to the end of the iteration."""
        self.rows[index][COL["alloc_bytes"]] += nbytes
        self.held += nbytes

    def done(self, end: int, grads_at: int = -1) -> PassTemplate:
        table = np.array(self.rows, dtype=np.float64).reshape(-1, len(COLUMNS))
        kind, alloc = COL["kind"], COL["alloc_bytes"]
        kept = sum(row[alloc] for row in self.rows if row[kind] != _GATHER) - self.held
        return PassTemplate(table, np.array([self.sources, self.targets], dtype=np.int64), end, grads_at, float(kept))
