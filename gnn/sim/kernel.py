"""The simulator's two inner loops, compiled with numba: the event-driven schedule and the memory replay.

They touch one node at a time, which in Python cost about 1 ms per graph of ~130 nodes, a third of building
and simulating a plan. The arithmetic is the same, in the same order, as the Python loops they replace
(tests/gnn/test_simulate.py checks schedules and peaks against hand-computed cases). Compiled once per
machine: ``cache=True`` keeps the machine code beside this file, so later processes load it in milliseconds.
"""

from __future__ import annotations

import numpy as np
from numba import njit

DONE_EPS = 1e-15  # a node whose remaining work is below this has finished


@njit(cache=True, nogil=True)
def event_schedule(
    est: np.ndarray,
    comm_rank: np.ndarray,
    indptr: np.ndarray,
    succ: np.ndarray,
    waiting: np.ndarray,
    num_ranks: int,
    compute_slots: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Start and end time per node. ``comm_rank`` is the rank of a transfer, -1 for compute; successors in CSR
    (``indptr``, ``succ``); ``waiting`` the number of predecessors (consumed). Transfers running together on a
    rank share its bandwidth equally. Compute nodes running together share ``compute_slots`` (inf: each rank
    has its own device): each runs at min(1, slots / running)."""
    n = est.shape[0]
    start, end = np.zeros(n), np.zeros(n)
    remaining = est.copy()
    sharing = np.zeros(num_ranks, np.int64)  # transfers running per rank
    computing = 0  # compute nodes running
    ready, active, still, rate = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n)
    n_ready = n_active = 0
    for i in range(n):
        if waiting[i] == 0:
            ready[n_ready] = i
            n_ready += 1
    now, done = 0.0, 0
    while done < n:
        for k in range(n_ready):
            i = ready[k]
            start[i] = now
            if comm_rank[i] >= 0:
                sharing[comm_rank[i]] += 1
            else:
                computing += 1
            active[n_active] = i
            n_active += 1
        n_ready = 0
        if n_active == 0:
            raise ValueError("the execution graph has a cycle: no node can start")
        step = np.inf
        compute_rate = min(1.0, compute_slots / computing) if computing > 0 else 1.0
        for k in range(n_active):
            i = active[k]
            rate[k] = 1.0 / sharing[comm_rank[i]] if comm_rank[i] >= 0 else compute_rate
            step = min(step, remaining[i] / rate[k])
        now += step
        n_still = 0
        for k in range(n_active):
            i = active[k]
            left = remaining[i] - step * rate[k]
            if left <= DONE_EPS:
                end[i] = now
                done += 1
                if comm_rank[i] >= 0:
                    sharing[comm_rank[i]] -= 1
                else:
                    computing -= 1
                for e in range(indptr[i], indptr[i + 1]):
                    j = succ[e]
                    waiting[j] -= 1
                    if waiting[j] == 0:
                        ready[n_ready] = j
                        n_ready += 1
            else:
                remaining[i] = left
                still[n_still] = i
                n_still += 1
        active[:n_still] = still[:n_still]
        n_active = n_still
    return start, end


@njit(cache=True, nogil=True)
def replay_peaks(
    start: np.ndarray,
    rank: np.ndarray,
    alloc: np.ndarray,
    free: np.ndarray,
    transient: np.ndarray,
    static: np.ndarray,
    event: np.ndarray,
    events: int,
) -> np.ndarray:
    """Peak bytes per rank and event: resident ``static`` plus the running sum of allocations in start-time order
    (ties in node order). A node that frees while it allocates does both layer by layer, so it adds its net change;
    transients live only while their node runs. ``event``: which of the ``events`` columns a node's peak counts in."""
    live, peak = np.zeros(static.shape[0]), np.zeros((static.shape[0], events))
    for i in np.argsort(start, kind="mergesort"):  # stable: equal starts stay in node order
        r, e = rank[i], event[i]
        peak[r, e] = max(peak[r, e], live[r] + max(alloc[i] - free[i], 0.0) + transient[i])
        live[r] += alloc[i] - free[i]
    return static[:, None] + peak


@njit(cache=True, nogil=True)
def _merged_length_overlap(a0: np.ndarray, a1: np.ndarray, b0: np.ndarray, b1: np.ndarray) -> float:
    """Length of (union of intervals a) intersected with (union of intervals b), both sorted by start."""
    # merge each side into disjoint intervals, then sweep both lists together
    ma0, ma1 = _merge(a0, a1)
    mb0, mb1 = _merge(b0, b1)
    total, i, j = 0.0, 0, 0
    while i < ma0.shape[0] and j < mb0.shape[0]:
        total += max(0.0, min(ma1[i], mb1[j]) - max(ma0[i], mb0[j]))
        if ma1[i] < mb1[j]:
            i += 1
        else:
            j += 1
    return total


@njit(cache=True, nogil=True)
def _merge(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals [a, b) sorted by a, merged into disjoint ones (empty ones dropped)."""
    out0, out1, k = np.empty(a.shape[0]), np.empty(a.shape[0]), 0
    for i in range(a.shape[0]):
        if b[i] <= a[i]:
            continue
        if k > 0 and a[i] <= out1[k - 1]:
            out1[k - 1] = max(out1[k - 1], b[i])
        else:
            out0[k], out1[k] = a[i], b[i]
            k += 1
    return out0[:k], out1[:k]


@njit(cache=True, nogil=True)
def busy_and_idle(
    start: np.ndarray,
    end: np.ndarray,
    rank: np.ndarray,
    stream: np.ndarray,
    est: np.ndarray,
    num_ranks: int,
    num_streams: int,
) -> tuple[np.ndarray, int, float, float]:
    """Busy seconds per rank and stream; the busiest rank's compute stream (the first of equals); and that
    rank's idle compute time split into exposed communication (one of its transfers runs) and bubble. Compute
    counts the time it ran (longer than its estimate where ranks shared cores); communication its estimate,
    the time at full bandwidth."""
    busy = np.zeros((num_ranks, num_streams))
    for i in range(est.shape[0]):
        busy[rank[i], stream[i]] += end[i] - start[i] if stream[i] == 0 else est[i]
    critical = 0
    for r in range(1, num_ranks):
        if busy[r, 0] > busy[critical, 0]:
            critical = r
    total = end.max() if end.shape[0] else 0.0
    order = np.argsort(start, kind="mergesort")
    compute0, compute1, comm0, comm1 = [0.0], [0.0], [0.0], [0.0]  # typed lists (a dummy empty interval first)
    for i in order:
        if rank[i] != critical:
            continue
        if stream[i] == 0:
            compute0.append(start[i])
            compute1.append(end[i])
        else:
            comm0.append(start[i])
            comm1.append(end[i])
    busy0, busy1 = _merge(np.array(compute0), np.array(compute1))
    # the gaps between busy intervals, in [0, total]
    gap0, gap1 = np.empty(busy0.shape[0] + 1), np.empty(busy0.shape[0] + 1)
    gap0[0] = 0.0
    gap0[1:] = busy1
    gap1[:-1] = busy0
    gap1[-1] = total
    idle = 0.0
    for k in range(gap0.shape[0]):
        idle += max(0.0, gap1[k] - gap0[k])
    exposed = _merged_length_overlap(gap0, gap1, np.array(comm0), np.array(comm1))
    return busy, critical, exposed, max(0.0, idle - exposed)


@njit(cache=True, nogil=True)
def simulate_table(
    table: np.ndarray,
    est_col: int,
    alloc_col: int,
    free_col: int,
    transient_col: int,
    comm_rank: np.ndarray,
    indptr: np.ndarray,
    succ: np.ndarray,
    waiting: np.ndarray,
    rank: np.ndarray,
    stream: np.ndarray,
    static: np.ndarray,
    num_streams: int,
    compute_slots: float,
    event: np.ndarray,
    events: int,
):
    """The schedule, the busy and idle times and the memory replay of a graph's node table, in one call: a
    plan's featurisation makes two, where three calls and their column copies cost ~15 us each."""
    est = table[:, est_col].copy()
    start, end = event_schedule(est, comm_rank, indptr, succ, waiting.copy(), static.shape[0], compute_slots)
    busy, critical, exposed, bubble = busy_and_idle(start, end, rank, stream, est, static.shape[0], num_streams)
    peaks = replay_peaks(
        start,
        rank,
        table[:, alloc_col].copy(),
        table[:, free_col].copy(),
        table[:, transient_col].copy(),
        static,
        event,
        events,
    )
    return start, end, busy, critical, exposed, bubble, peaks
