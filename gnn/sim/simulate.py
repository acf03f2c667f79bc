"""Critical-path simulation of an execution graph, and peak memory by replay.

Each pipeline rank has three streams: compute, collectives, and pipeline
send/recv. A node starts when all its predecessors have finished: its data
dependencies, and the previous node on its own stream (program order). This
gives Algorithm 1 of Lin et al. ("Towards Universal Performance Modeling for ML Training on Multi-GPU
Platforms"): intra-rank
synchronisation where compute waits on communication, and inter-rank
synchronisation at send/recv. DP and TP replicas run in lock-step, so their
collectives synchronise implicitly.

Communication overlaps compute wherever the graph allows it. Transfers that
are active at the same time on one rank share its link bandwidth, as in
Proteus's HTAE: each of k concurrent transfers progresses at 1/k of its full
rate, so the simulation is event-driven. Bubbles come from the schedule's order.
Ranks that share a machine's cores (gloo ranks on a CPU) share them the same
way: with ``compute_slots`` cores per pipeline rank's replicas (the graph's
globals), k compute nodes running at once each run at min(1, slots / k).

Memory: per rank, resident state (parameters, optimizer, DDP's gradient
buckets) plus a replay of each node's allocations in start-time order: a forward keeps its
saved activations until the matching backward frees them, a stage's first
backward allocates its gradients, and transients live only while their node
runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnn.graph.build import ExecGraph
from gnn.graph.table import COL, NUM_STREAMS, PASS_PHASES
from gnn.sim.kernel import simulate_table


@dataclass
class SimResult:
    iter_time_s: float
    peak_mem_bytes: float  # max over ranks
    peak_mem_per_rank: list[float]
    compute_s: float  # busiest rank's compute-stream time
    comm_s: float  # busiest rank's communication time at full bandwidth (both comm streams)
    exposed_comm_s: float  # busiest rank's idle compute time while one of its transfers runs
    bubble_s: float  # busiest rank's idle compute time with no transfer of its own running (waiting on others)
    start: np.ndarray
    end: np.ndarray
    # [ranks, events] each rank's peak during its schedule (column 0) and at each row of its end of iteration: each
    # is affine in the micro-batch count, their maximum need not be (gnn.sim.plan extrapolates them one by one)
    peak_mem_per_event: np.ndarray | None = None


def simulate(g: ExecGraph) -> SimResult:
    """Event-driven: start ready nodes, advance to the next completion, re-share bandwidth (gnn.sim.kernel)."""
    arrays = _structure(g)
    start, end, busy, critical, exposed, bubble, peaks = simulate_table(
        g.table,
        COL["est_time"],
        COL["alloc_bytes"],
        COL["free_bytes"],
        COL["transient_bytes"],
        arrays["comm_rank"],
        arrays["indptr"],
        arrays["successors"],
        arrays["waiting"],
        arrays["rank"],
        arrays["stream"],
        np.array(g.static_bytes, dtype=np.float64),
        NUM_STREAMS,
        float(g.globals.get("compute_slots", np.inf)),
        arrays["event"],
        int(arrays["event"].max(initial=0)) + 1,
    )
    per_rank = peaks.max(axis=1).tolist()
    return SimResult(
        float(end.max(initial=0.0)),
        max(per_rank),
        per_rank,
        float(busy[critical, 0]),
        float(busy[critical, 1:].sum()),
        exposed,
        bubble,
        start,
        end,
        peaks,
    )


def _structure(g: ExecGraph) -> dict[str, np.ndarray]:
    """What the event-driven schedule (gnn.sim.kernel) needs from the graph's structure: successors in CSR,
    predecessor counts, each node's rank and stream, the rank of each transfer (-1 for compute), and each node's
    memory event (0 in the schedule, 1 + its row in an end-of-iteration pass).
    Shared by the graphs of one placement (ExecGraph.structure)."""
    found = g.structure.get("simulate")
    if found is None:
        n = g.num_nodes
        src, dst = g.edge_index
        order = np.argsort(src, kind="stable")  # successors grouped by source, in edge order
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
        rank, stream = g.column("rank").astype(np.int64), g.column("stream").astype(np.int64)
        found = g.structure["simulate"] = {
            "indptr": indptr,
            "successors": dst[order].copy(),
            "waiting": np.bincount(dst, minlength=n).astype(np.int64),
            "rank": rank,
            "stream": stream,
            "comm_rank": np.where(stream > 0, rank, -1),
            "event": _events(g),
        }
    return found


def _events(g: ExecGraph) -> np.ndarray:
    """Each node's memory event: 0 in the schedule's passes, 1 + its row for the rows of an end-of-iteration pass."""
    starts = np.append(g.passes.start, g.num_nodes)
    sizes = np.diff(starts)
    row = np.arange(g.num_nodes) - np.repeat(starts[:-1], sizes)
    step = np.repeat(g.passes.phase == PASS_PHASES.index("step"), sizes)
    return np.where(step, row + 1, 0).astype(np.int64)
