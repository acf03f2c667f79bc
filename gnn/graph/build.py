"""Compile (workload, plan, cluster, hardware) into a distributed execution graph.

In the spirit of Proteus's distributed execution graph (Duan et al., "Proteus: Simulating the Performance of
Distributed DNN Training"):
nodes are compute blocks (embedding, attention, MLP, head/loss, per pipeline
stage, micro-batch and phase, plus the optimizer step) and communication (TP
all-reduce or reduce-scatter/all-gather, DP gradient all-reduce, FSDP
all-gather / reduce-scatter, ZeRO-1 parameter all-gather, pipeline send/recv).
Edges are data dependencies and each rank's program order on its streams
(compute, collectives, pipeline send/recv), which is where the pipeline
schedule lives.

Size: only pipeline ranks are expanded. DP and TP replicas are symmetric, so
they appear as group sizes on the collectives. A stage's repeated layers are
compressed into one attention and one MLP node with a layer count. The graph
grows with stages x micro-batches, not with GPU count.

Speed: the graph is a table, one row per node (``COLUMNS``), not a list of
objects. The passes of one stage differ only in their micro-batch and rank, so
each distinct pass is compiled once (gnn.graph.passes) and its rows are repeated
wherever the schedule places it (gnn.graph.layout, cached per pipeline shape);
program-order edges come from one stable sort.
``ExecGraph.nodes`` still gives Node objects, for reading a graph by eye.

Two granularities: the simulator runs on the nodes above (it needs every
collective to overlap compute and every allocation to replay memory), while
the GNN reads ``ExecGraph.passes``: one node per pass (a stage's forward or
backward of one micro-batch, a rank's optimizer step), its blocks summarised
as features (gnn.dataset.features). A pass holds ~5 nodes, and the forward pass of the
GNN costs per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from collect.schema import Cluster, Plan, Workload
from gnn.costs.hardware import HardwareModel
from gnn.graph.layout import cache_bounded, chain, clear_layouts, plan_layout, uneven_layers, with_kinds
from gnn.graph.passes import PassCompiler
from gnn.graph.table import COL, COLUMNS, EDGE_KINDS, KINDS, NUM_STREAMS, PHASES, Node


@dataclass
class PassView:
    """The graph one level up: a node per pass. The table stores each pass's rows contiguously."""

    start: np.ndarray  # [passes] the pass's first row in the table
    phase: np.ndarray  # [passes] index into PASS_PHASES
    edge_index: np.ndarray  # [2, edges] between passes: what a pass waits for, and each rank's order of passes
    edge_kind: np.ndarray  # [edges] index into EDGE_KINDS

    @classmethod
    def per_node(cls, table: np.ndarray, edge_index: np.ndarray, edge_kind: np.ndarray) -> "PassView":
        """Each node its own pass: for graphs written out by hand."""
        phase = np.array([0, 1, 1, 2])[table[:, COL["phase"]].astype(np.int64)]  # recompute belongs to a backward
        return cls(np.arange(len(table)), phase, edge_index, edge_kind)


@dataclass
class ExecGraph:
    table: np.ndarray  # [nodes, COLUMNS] float64
    edge_index: np.ndarray  # [2, edges] int64: source, target
    edge_kind: np.ndarray  # [edges] int64, index into EDGE_KINDS
    static_bytes: list[float]  # resident state per pipeline rank
    plan: Plan | None
    workload: Workload | None
    globals: dict = field(default_factory=dict)
    passes: PassView | None = None  # None: each node its own pass
    # arrays derived from the structure alone (edges, ranks, streams), e.g. the simulator's adjacency: graphs
    # that share a placement share this dict, so each is derived once
    structure: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.passes is None:
            self.passes = PassView.per_node(self.table, self.edge_index, self.edge_kind)

    @classmethod
    def from_nodes(
        cls,
        nodes: list[Node],
        edges: list[tuple[int, int, str]],
        static_bytes: list[float],
        plan: Plan | None = None,
        workload: Workload | None = None,
    ) -> "ExecGraph":
        """A graph written out by hand (tests, examples)."""
        table = np.array([n.row() for n in nodes], dtype=np.float64).reshape(-1, len(COLUMNS))
        index = np.array([(s, d) for s, d, _ in edges], dtype=np.int64).reshape(-1, 2).T.copy()
        kinds = np.array([EDGE_KINDS.index(k) for _, _, k in edges], dtype=np.int64)
        return cls(table, index, kinds, list(static_bytes), plan, workload)

    def column(self, name: str) -> np.ndarray:
        return self.table[:, COL[name]]

    @property
    def num_nodes(self) -> int:
        return self.table.shape[0]

    @property
    def num_ranks(self) -> int:
        return len(self.static_bytes)

    @property
    def nodes(self) -> list[Node]:
        """The rows as Node objects: for reading and drawing a graph, not for the hot path."""
        out = []
        for r in self.table.tolist():
            node = Node(
                KINDS[int(r[0])], PHASES[int(r[1])], *map(int, r[2:6]), r[6], r[7], int(r[8]), bool(r[9]), *r[10:14]
            )
            out.append(node)
        return out

    @property
    def edges(self) -> list[tuple[int, int, str]]:
        return [(s, d, EDGE_KINDS[k]) for (s, d), k in zip(self.edge_index.T.tolist(), self.edge_kind.tolist())]


def build_graph(w: Workload, plan: Plan, cluster: Cluster, hw: HardwareModel, compiler=None) -> ExecGraph:
    """``compiler``: a gnn.graph.passes.PassCompiler for the same plan up to its micro-batch count, to share its
    passes."""
    if compiler is None:
        compiler = PassCompiler(w, plan, cluster, hw)
    layout = plan_layout(plan, uneven_layers(plan, w))
    templates = [
        compiler.step(rep[1], plan.num_microbatches) if rep[0] == "S" else compiler.template(*rep)
        for rep in layout.representatives
    ]
    key = (layout.key, *(t.shape for t in templates))
    placed = _PLACEMENTS.get(key)
    if placed is None:
        placed = _Placement.of(templates, layout)
        cache_bounded(_PLACEMENTS, key, placed, len(placed.rows), PLACEMENT_CACHE, PLACEMENT_NODES)
    table = np.concatenate([t.table for t in templates])[placed.rows]
    table[:, _POSITION] = placed.position
    return ExecGraph(
        table,
        placed.edge_index,
        placed.edge_kind,
        compiler.static_bytes(),
        plan,
        w,
        {"hardware": hw.id, "compute_slots": hw.compute_slots(plan)},
        PassView(placed.bases, layout.phase, layout.edge_index, layout.edge_kind),
        placed.structure,
    )


PLACEMENT_CACHE = 2048
PLACEMENT_NODES = 400_000  # and nodes in all (~200 bytes each with the simulator's structure)
_PLACEMENTS: dict[tuple, "_Placement"] = {}


def clear_caches() -> None:
    """Forget cached layouts and placements (benchmarks of cold builds; nothing else needs it)."""
    clear_layouts()
    _PLACEMENTS.clear()


_POSITION = slice(COL["rank"], COL["microbatch"] + 1)
assert COLUMNS[_POSITION] == ("rank", "stage", "microbatch")


@dataclass
class _Placement:
    """Where a layout puts the rows of its templates, and the edges that result. It depends on the templates'
    shapes (sizes, streams, edges), not on their costs, so plans of one pipeline shape share it (cached by both):
    building their graphs is then one gather."""

    rows: np.ndarray  # [nodes] index into the templates' rows, concatenated
    position: np.ndarray  # [nodes, 3] rank, stage, micro-batch
    bases: np.ndarray  # [passes] each pass's first row
    edge_index: np.ndarray
    edge_kind: np.ndarray
    structure: dict = field(default_factory=dict)  # ExecGraph.structure of every graph placed this way

    @classmethod
    def of(cls, templates, layout) -> "_Placement":
        template_sizes = np.array([len(t.table) for t in templates])
        sizes = template_sizes[layout.kind]
        bases = np.cumsum(sizes) - sizes
        bank_start = np.cumsum(template_sizes) - template_sizes
        rows = np.repeat(bank_start[layout.kind] - bases, sizes) + np.arange(sizes.sum())
        where = np.stack([layout.rank, layout.stage, layout.microbatch], 1)
        position = np.repeat(where, sizes, axis=0).astype(np.float64)
        streams = np.concatenate([t.table[:, COL["stream"]] for t in templates])[rows]
        ends = bases + np.array([t.end for t in templates])[layout.kind]
        # a pass's first node waits for the ends of the passes it needs; inside a pass, its own edges
        inner = [(t.edges[:, :, None] + bases[placed]).reshape(2, -1) for t, placed in zip(templates, layout.passes_of)]
        data = np.concatenate([np.stack([ends[layout.dep_src], bases[layout.dep_dst]]), *inner], axis=1)
        # program order: each node to the next one on its rank and stream, in build order
        edge_index, edge_kind = with_kinds(data, chain(position[:, 0] * NUM_STREAMS + streams))
        for array in (rows, position, bases, edge_index, edge_kind):
            array.flags.writeable = False  # shared by every graph of this shape
        return cls(rows, position, bases, edge_index, edge_kind)
