"""Critical-path simulation of an execution graph, and peak memory by replay.

Each pipeline rank has a compute stream and a communication stream. A node
starts when all its predecessors (data dependencies, and the previous node on
its own stream: program order) have finished. This gives Algorithm 1 of Lin et
al. (../shared/seeds/002): intra-rank synchronisation where compute waits on
communication, and inter-rank synchronisation at send/recv, which
synchronises pipeline ranks. DP and TP replicas run in lock-step, so their
collectives synchronise implicitly. Communication overlaps compute whenever
the graph allows it (DDP buckets after the backward, FSDP gathers ahead of use).
Bubbles appear from the schedule's order.

Memory: per rank, resident state (parameters, gradients, optimizer) plus a
replay of each node's allocations in start-time order: a forward keeps its
saved activations until the matching backward frees them, and transients live
only while their node runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnn.graph import ExecGraph


@dataclass
class SimResult:
    iter_time_s: float
    peak_mem_bytes: float  # max over ranks
    peak_mem_per_rank: list[float]
    compute_s: float  # busiest rank's compute-stream time
    comm_s: float  # busiest rank's communication-stream time
    exposed_comm_s: float  # iteration time not covered by the busiest rank's compute
    bubble_s: float  # idle compute time on the busiest rank
    start: np.ndarray
    end: np.ndarray


def simulate(g: ExecGraph) -> SimResult:
    n = len(g.nodes)
    start, end = np.zeros(n), np.zeros(n)
    preds: list[list[int]] = [[] for _ in range(n)]
    for src, dst, _ in g.edges:
        preds[dst].append(src)
    # Nodes are created in an order that respects every edge (the compiler adds a
    # node only after its dependencies), so one forward sweep is a topological pass.
    for i, node in enumerate(g.nodes):
        t0 = max((end[p] for p in preds[i]), default=0.0)
        start[i], end[i] = t0, t0 + node.est_time
    total = float(end.max()) if n else 0.0
    busy = np.zeros((g.num_ranks, 2))
    for node in g.nodes:
        busy[node.rank, node.stream] += node.est_time
    critical = int(np.argmax(busy[:, 0]))
    peaks = _replay_memory(g, start)
    return SimResult(total, max(peaks), peaks, float(busy[critical, 0]), float(busy[critical, 1]),
                     max(0.0, total - float(busy[critical, 0])), max(0.0, total - float(busy[critical, 0])),
                     start, end)


def _replay_memory(g: ExecGraph, start: np.ndarray) -> list[float]:
    peaks = []
    for rank in range(g.num_ranks):
        idx = [i for i, node in enumerate(g.nodes) if node.rank == rank]
        idx.sort(key=lambda i: (start[i], i))
        live = peak = 0.0
        for i in idx:
            node = g.nodes[i]
            peak = max(peak, live + node.alloc_bytes + node.transient_bytes)
            live += node.alloc_bytes - node.free_bytes
        peaks.append(g.static_bytes[rank] + peak)
    return peaks
