"""Critical-path simulation of an execution graph, and peak memory by replay.

Each pipeline rank has three streams: compute, collectives, and pipeline
send/recv. A node starts when all its predecessors have finished: its data
dependencies, and the previous node on its own stream (program order). This
gives Algorithm 1 of Lin et al. (../shared/seeds/002): intra-rank
synchronisation where compute waits on communication, and inter-rank
synchronisation at send/recv. DP and TP replicas run in lock-step, so their
collectives synchronise implicitly.

Communication overlaps compute wherever the graph allows it. Transfers that
are active at the same time on one rank share its link bandwidth, as in
Proteus's HTAE: each of k concurrent transfers progresses at 1/k of its full
rate, so the simulation is event-driven. Bubbles come from the schedule's order.

Memory: per rank, resident state (parameters, optimizer, DDP's gradient
buckets) plus a replay of each node's allocations in start-time order: a forward keeps its
saved activations until the matching backward frees them, a stage's first
backward allocates its gradients, and transients live only while their node
runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnn.graph import ExecGraph
from gnn.simkernel import event_schedule, replay_peaks

NUM_STREAMS = 3


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


def simulate(g: ExecGraph) -> SimResult:
    start_array, end_array = _schedule(g)
    start, end = start_array.tolist(), end_array.tolist()  # _split_idle walks them one by one
    total = max(end, default=0.0)
    busy = [[0.0] * NUM_STREAMS for _ in range(g.num_ranks)]
    for node in g.nodes:
        busy[node.rank][node.stream] += node.est_time
    critical = max(range(g.num_ranks), key=lambda r: busy[r][0])  # the first of equally busy ranks
    exposed, bubble = _split_idle(g, start, end, critical, total)
    peaks = _replay_memory(g, start_array)
    return SimResult(total, max(peaks), peaks, busy[critical][0], sum(busy[critical][1:]), exposed, bubble,
                     start_array, end_array)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        elif b > a:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _split_idle(g: ExecGraph, start: list[float], end: list[float], rank: int, total: float) -> tuple[float, float]:
    """A rank's idle compute time, split into exposed communication (a transfer of this rank is running)
    and bubble (the rank waits on other ranks)."""
    mine = [i for i, node in enumerate(g.nodes) if node.rank == rank]
    busy = _union([(start[i], end[i]) for i in mine if g.nodes[i].stream == 0])
    comm = _union([(start[i], end[i]) for i in mine if g.nodes[i].stream > 0])
    edges = [0.0] + [t for interval in busy for t in interval] + [total]
    gaps = [(edges[k], edges[k + 1]) for k in range(0, len(edges), 2) if edges[k + 1] > edges[k]]
    idle = sum(b - a for a, b in gaps)
    return (exposed := _overlap(gaps, comm)), max(0.0, idle - exposed)


def _overlap(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    """Total overlap of two sorted lists of disjoint intervals, in one merge pass."""
    total, i, j = 0.0, 0, 0
    while i < len(xs) and j < len(ys):
        (a, b), (c, d) = xs[i], ys[j]
        total += max(0.0, min(b, d) - max(a, c))
        if b < d:
            i += 1
        else:
            j += 1
    return total


def _schedule(g: ExecGraph) -> tuple[np.ndarray, np.ndarray]:
    """Event-driven: start ready nodes, advance to the next completion, re-share bandwidth (gnn.simkernel)."""
    n = len(g.nodes)
    edges = np.array([(s, d) for s, d, _ in g.edges], dtype=np.int64).reshape(-1, 2)
    order = np.argsort(edges[:, 0], kind="stable")  # successors grouped by source, in edge order
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(edges[:, 0], minlength=n), out=indptr[1:])
    waiting = np.bincount(edges[:, 1], minlength=n).astype(np.int64)
    est = np.array([node.est_time for node in g.nodes], dtype=np.float64)
    comm_rank = np.array([node.rank if node.stream else -1 for node in g.nodes], dtype=np.int64)
    return event_schedule(est, comm_rank, indptr, edges[order, 1].copy(), waiting, g.num_ranks)


def _replay_memory(g: ExecGraph, start: np.ndarray) -> list[float]:
    columns = np.array([(node.rank, node.alloc_bytes, node.free_bytes, node.transient_bytes) for node in g.nodes],
                       dtype=np.float64).reshape(-1, 4)
    peaks = replay_peaks(start, columns[:, 0].astype(np.int64), columns[:, 1], columns[:, 2], columns[:, 3],
                         np.array(g.static_bytes, dtype=np.float64))
    return peaks.tolist()
