"""An execution graph's node table: its columns, the kinds, phases and streams a node can have, and one row.

Numpy-free constants and a plain list per row, shared by the pass compiler
(gnn.graph.passes), the graph builder (gnn.graph.build), the simulator and the
features.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = (
    "embed",
    "attn",
    "mlp",
    "head",
    "optimizer",
    "tp_comm",
    "dp_comm",
    "fsdp_allgather",
    "fsdp_reducescatter",
    "zero_allgather",
    "p2p",
    "ep_a2a",
    "cp_ring",
)
COMM_KINDS = frozenset(KINDS[5:])
STREAMS = {**{k: 1 for k in COMM_KINDS}, "p2p": 2}
PHASES = ("forward", "backward", "recompute", "step")
PASS_PHASES = ("forward", "backward", "step")
EDGE_KINDS = ("data", "order")
NUM_STREAMS = 3
COLUMNS = (
    "kind",
    "phase",
    "rank",
    "stage",
    "microbatch",
    "count",
    "flops",
    "message_bytes",
    "group",
    "crosses_node",
    "alloc_bytes",
    "free_bytes",
    "transient_bytes",
    "est_time",
    "stream",
)
COL = {name: i for i, name in enumerate(COLUMNS)}
_KIND_INDEX = {k: i for i, k in enumerate(KINDS)}
_PHASE_INDEX = {p: i for i, p in enumerate(PHASES)}


@dataclass(slots=True)
class Node:
    kind: str
    phase: str
    rank: int
    stage: int
    microbatch: int
    count: int = 1  # compressed repeats (layers, collectives per layer)
    flops: float = 0.0
    message_bytes: float = 0.0  # per collective call, per rank
    group: int = 1
    crosses_node: bool = False
    alloc_bytes: float = 0.0  # kept after the node ends (saved activations)
    free_bytes: float = 0.0  # released when the node ends
    transient_bytes: float = 0.0  # live only while the node runs
    est_time: float = 0.0
    # 0 compute, 1 collectives, 2 pipeline send/recv (its own communicator, as in torch)
    stream: int = field(init=False)

    def __post_init__(self):
        self.stream = STREAMS.get(self.kind, 0)

    def row(self) -> list:
        return table_row(
            self.kind,
            self.phase,
            self.rank,
            self.stage,
            self.microbatch,
            self.count,
            self.flops,
            self.message_bytes,
            self.group,
            self.crosses_node,
            self.alloc_bytes,
            self.free_bytes,
            self.transient_bytes,
            self.est_time,
        )


def table_row(
    kind: str,
    phase: str,
    rank: int,
    stage: int,
    microbatch: int,
    count: int,
    flops: float,
    message_bytes: float,
    group: int,
    crosses_node: bool,
    alloc_bytes: float,
    free_bytes: float,
    transient_bytes: float,
    est_time: float,
) -> list:
    """A node as a row of the table, in COLUMNS order (fields as Node's); the stream follows from the kind."""
    return [
        _KIND_INDEX[kind],
        _PHASE_INDEX[phase],
        rank,
        stage,
        microbatch,
        count,
        flops,
        message_bytes,
        group,
        float(crosses_node),
        alloc_bytes,
        free_bytes,
        transient_bytes,
        est_time,
        STREAMS.get(kind, 0),
    ]
