"""The simulator's two inner loops, compiled with numba: the event-driven schedule and the memory replay.

They touch one node at a time, which in Python cost about 1 ms per graph of ~130 nodes, a third of building
and simulating a plan. The arithmetic is the same, in the same order, as the Python loops they replace
(tests/unit/test_simulate.py checks schedules and peaks against hand-computed cases). Compiled once per
machine: ``cache=True`` keeps the machine code beside this file, so later processes load it in milliseconds.
"""
from __future__ import annotations

import numpy as np
from numba import njit

DONE_EPS = 1e-15  # a node whose remaining work is below this has finished


@njit(cache=True)
def event_schedule(est: np.ndarray, comm_rank: np.ndarray, indptr: np.ndarray, succ: np.ndarray,
                   waiting: np.ndarray, num_ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end time per node. ``comm_rank`` is the rank of a transfer, -1 for compute; successors in CSR
    (``indptr``, ``succ``); ``waiting`` the number of predecessors (consumed). Transfers running together on a
    rank share its bandwidth equally; compute runs at full rate."""
    n = est.shape[0]
    start, end = np.zeros(n), np.zeros(n)
    remaining = est.copy()
    sharing = np.zeros(num_ranks, np.int64)  # transfers running per rank
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
            active[n_active] = i
            n_active += 1
        n_ready = 0
        if n_active == 0:
            raise ValueError("the execution graph has a cycle: no node can start")
        step = np.inf
        for k in range(n_active):
            i = active[k]
            rate[k] = 1.0 / sharing[comm_rank[i]] if comm_rank[i] >= 0 else 1.0
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


@njit(cache=True)
def replay_peaks(start: np.ndarray, rank: np.ndarray, alloc: np.ndarray, free: np.ndarray, transient: np.ndarray,
                 static: np.ndarray) -> np.ndarray:
    """Peak bytes per rank: resident ``static`` plus the running sum of allocations in start-time order (ties
    in node order). A node that frees while it allocates does both layer by layer, so it adds its net change;
    transients live only while their node runs."""
    live, peak = np.zeros(static.shape[0]), np.zeros(static.shape[0])
    for i in np.argsort(start, kind="mergesort"):  # stable: equal starts stay in node order
        r = rank[i]
        peak[r] = max(peak[r], live[r] + max(alloc[i] - free[i], 0.0) + transient[i])
        live[r] += alloc[i] - free[i]
    return static + peak
