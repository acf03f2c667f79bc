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

Memory: per rank, resident state (parameters, gradients, optimizer) plus a
replay of each node's allocations in start-time order: a forward keeps its
saved activations until the matching backward frees them, and transients live
only while their node runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnn.graph import ExecGraph

NUM_STREAMS = 3


@dataclass
class SimResult:
    iter_time_s: float
    peak_mem_bytes: float  # max over ranks
    peak_mem_per_rank: list[float]
    compute_s: float  # busiest rank's compute-stream time
    comm_s: float  # busiest rank's communication time at full bandwidth (both comm streams)
    exposed_comm_s: float  # iteration time not covered by the busiest rank's compute
    bubble_s: float  # idle compute time on the busiest rank
    start: np.ndarray
    end: np.ndarray


def simulate(g: ExecGraph) -> SimResult:
    start, end = _schedule(g)
    total = float(end.max()) if len(end) else 0.0
    busy = np.zeros((g.num_ranks, NUM_STREAMS))
    for node in g.nodes:
        busy[node.rank, node.stream] += node.est_time
    critical = int(np.argmax(busy[:, 0]))
    idle = max(0.0, total - float(busy[critical, 0]))
    peaks = _replay_memory(g, start)
    return SimResult(total, max(peaks), peaks, float(busy[critical, 0]), float(busy[critical, 1:].sum()),
                     idle, idle, start, end)


def _schedule(g: ExecGraph) -> tuple[np.ndarray, np.ndarray]:
    """Event-driven: start ready nodes, advance to the next completion, re-share bandwidth."""
    n = len(g.nodes)
    start, end = np.zeros(n), np.zeros(n)
    succs: list[list[int]] = [[] for _ in range(n)]
    waiting = np.zeros(n, dtype=np.int64)
    for src, dst, _ in g.edges:
        succs[src].append(dst)
        waiting[dst] += 1
    remaining = np.array([node.est_time for node in g.nodes], dtype=float)
    is_comm = np.array([node.stream > 0 for node in g.nodes])
    ranks = np.array([node.rank for node in g.nodes])
    now, done = 0.0, 0
    active: set[int] = set()
    ready = [i for i in range(n) if waiting[i] == 0]
    while done < n:
        for i in ready:
            start[i] = now
            active.add(i)
        ready = []
        sharing = {}
        for i in active:
            if is_comm[i]:
                sharing[ranks[i]] = sharing.get(ranks[i], 0) + 1
        rate = {i: 1.0 / sharing[ranks[i]] if is_comm[i] else 1.0 for i in active}
        step = min(remaining[i] / rate[i] for i in active)
        now += step
        for i in list(active):
            remaining[i] -= step * rate[i]
            if remaining[i] <= 1e-15:
                active.discard(i)
                end[i] = now
                done += 1
                for j in succs[i]:
                    waiting[j] -= 1
                    if waiting[j] == 0:
                        ready.append(j)
    return start, end


def _replay_memory(g: ExecGraph, start: np.ndarray) -> list[float]:
    by_rank: list[list[int]] = [[] for _ in range(g.num_ranks)]
    for i, node in enumerate(g.nodes):
        by_rank[node.rank].append(i)
    peaks = []
    for rank, idx in enumerate(by_rank):
        idx.sort(key=lambda i: (start[i], i))
        live = peak = 0.0
        for i in idx:
            node = g.nodes[i]
            peak = max(peak, live + node.alloc_bytes + node.transient_bytes)
            live += node.alloc_bytes - node.free_bytes
        peaks.append(g.static_bytes[rank] + peak)
    return peaks
