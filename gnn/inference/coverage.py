"""Where a query leaves the measured runs behind: the range of each plan quantity a model was trained on, per
hardware domain, and which of them a query lies outside.

The network corrects physics with what it learned from measured runs. Asked about a GPU it never saw, a model
larger than any it saw, or a family it never saw, that correction is extrapolated; every prediction says which
quantities of its plan lie outside the training rows, so a user can tell an answer backed by measurements nearby
from one that is not. Memory is learned from fewer rows than time (only runs that report a peak), so it has its
own range, and its phrases start with "peak memory:". It is a range check per quantity, not an error estimate
(the 80% interval is that): inside every range a plan can still be far from any measured one. On the held-out
splits' test rows, against their training rows (experiments/results/evaluation_gpu.txt), it flags for time every
V100 and Blackwell row (no such GPU in training), every unseen A100 width, 28 of the 37 held-out-source H100 rows
(sequence lengths and families the playbook never ran) and 3 of the 242 rows at 256 GPUs; for memory alone,
every 80B row (the peaks measured on H100 are of 1.3B and 3.6B models; the NeMo runs up to 405B report time
only) and every row at 256 GPUs (peaks measured up to 128).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from collect.schema import RunSpec
from gnn.dataset.rows import has_memory, has_time

# numeric quantities whose trained range is recorded: model shape and size, scale, the parallel degrees
RANGED = ("num_params", "layers", "hidden", "seq_len", "micro_batch_size", "world_size", "dp", "tp", "pp")
LISTED = ("family",)  # categories: a value never trained on is outside


def training_range(rows: pd.DataFrame) -> dict[str, dict]:
    """{domain: {"runs": n, quantity: [lo, hi], "family": [values], "memory": {the same over the rows with a
    measured peak}}} over the rows a model was trained on. Memory has its own range because its correction is
    learned only where a peak was measured: the NeMo H100 rows carry time alone, vTrain's A100 rows too; time's is
    over the rows with a measured time (a full-size fake trace has a peak only)."""
    ranges = {}
    for domain, group in rows.groupby("domain"):
        measured = group[has_memory(group)] if "peak_mem_bytes" in group else group.iloc[:0]
        timed = group[has_time(group)]
        ranges[str(domain)] = (_ranges(timed) if len(timed) else {"runs": 0}) | {
            "memory": _ranges(measured) if len(measured) else {"runs": 0}
        }
    return ranges


def _ranges(group: pd.DataFrame) -> dict:
    entry: dict = {"runs": len(group)}
    entry |= {k: [float(v.min()), float(v.max())] for k, v in ((k, _column(group, k)) for k in RANGED)}
    return entry | {k: sorted(group[k].dropna().astype(str).unique()) for k in LISTED}


def _column(rows: pd.DataFrame, k: str) -> pd.Series:
    # converted rows may leave num_params out; the graph feature holds it for every row (w.num_params)
    return np.rint(np.exp(rows["f_log_params"])) if k == "num_params" and "f_log_params" in rows else rows[k]


def spec_values(spec: RunSpec) -> dict:
    w, p = spec.workload, spec.plan
    return {
        "num_params": w.num_params,
        "layers": w.layers,
        "hidden": w.hidden,
        "seq_len": w.seq_len,
        "micro_batch_size": w.micro_batch_size,
        "world_size": spec.cluster.world_size,
        "dp": p.dp,
        "tp": p.tp,
        "pp": p.pp,
        "family": w.family,
    }


def outside(values: dict, domain: str, ranges: dict[str, dict]) -> list[str]:
    """What of one query lies outside the training rows of its domain, one phrase each ([] when nothing); then,
    prefixed "peak memory:", what lies outside only the rows with a measured peak (ranges saved before memory had
    its own range say nothing of it)."""
    trained = ranges.get(domain)
    if trained is None:
        return [f"hardware {domain}: no training runs on it (trained on {', '.join(sorted(ranges)) or 'nothing'})"]
    found = _beyond(values, trained, f"trained on {domain}", "trained")
    memory = trained.get("memory")
    if memory is None:
        return list(found.values())
    if not memory["runs"]:
        learned = sorted(d for d, r in ranges.items() if r.get("memory", {}).get("runs"))
        where = f"learned on {', '.join(learned)}" if learned else "nor did any training run elsewhere"
        return [*found.values(), f"peak memory: no training run on {domain} measured it ({where})"]
    beyond_memory = _beyond(values, memory, f"with a measured peak on {domain}", "measured")
    return [*found.values(), *(f"peak memory: {p}" for k, p in beyond_memory.items() if k not in found)]


def _beyond(values: dict, trained: dict, where: str, seen: str) -> dict[str, str]:
    """{quantity: phrase} for each quantity of ``values`` outside ``trained``'s ranges; ``where``: "trained on
    h100" or the like, ``seen``: what the listed values were ("trained")."""
    found = {}
    for k in RANGED:
        lo, hi = trained[k]
        if values[k] > hi:
            found[k] = f"{k} {values[k]:.3g} above the largest {where}, {hi:.3g}"
        elif values[k] < lo:
            found[k] = f"{k} {values[k]:.3g} below the smallest {where}, {lo:.3g}"
    for k in LISTED:
        if str(values[k]) not in trained[k]:
            found[k] = f"{k} {values[k]} never {where} ({seen}: {', '.join(trained[k])})"
    return found
