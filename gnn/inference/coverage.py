"""Where a query leaves the measured runs behind: the range of each plan quantity a model was trained on, per
hardware domain, and which of them a query lies outside.

The network corrects physics with what it learned from measured runs. Asked about a GPU it never saw, a model
larger than any it saw, or a family it never saw, that correction is extrapolated; every prediction says which
quantities of its plan lie outside the training rows, so a user can tell an answer backed by measurements nearby
from one that is not. It is a range check per quantity, not an error estimate (the 80% interval is that): inside
every range a plan can still be far from any measured one. On the held-out splits
(experiments/results/evaluation_gpu.txt) it flags every V100 row (no V100 in training), every unseen A100 width
and depth, and 28 of the 37 held-out-source H100 rows (sequence lengths and families the playbook never ran);
it flags none of the held-out 80B rows, whose size lies between the playbook's 3.6B and NeMo's 405B runs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from collect.schema import RunSpec

# numeric quantities whose trained range is recorded: model shape and size, scale, the parallel degrees
RANGED = ("num_params", "layers", "hidden", "seq_len", "micro_batch_size", "world_size", "dp", "tp", "pp")
LISTED = ("family",)  # categories: a value never trained on is outside


def training_range(rows: pd.DataFrame) -> dict[str, dict]:
    """{domain: {"runs": n, quantity: [lo, hi], "family": [values]}} over the rows a model was trained on."""
    ranges = {}
    for domain, group in rows.groupby("domain"):
        entry: dict = {"runs": len(group)}
        entry |= {k: [float(v.min()), float(v.max())] for k, v in ((k, _column(group, k)) for k in RANGED)}
        entry |= {k: sorted(group[k].dropna().astype(str).unique()) for k in LISTED}
        ranges[str(domain)] = entry
    return ranges


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
    """What of one query lies outside the training rows of its domain, one phrase each ([] when nothing)."""
    trained = ranges.get(domain)
    if trained is None:
        return [f"hardware {domain}: no training runs on it (trained on {', '.join(sorted(ranges)) or 'nothing'})"]
    found = []
    for k in RANGED:
        lo, hi = trained[k]
        if values[k] > hi:
            found.append(f"{k} {values[k]:.3g} above the largest trained on {domain}, {hi:.3g}")
        elif values[k] < lo:
            found.append(f"{k} {values[k]:.3g} below the smallest trained on {domain}, {lo:.3g}")
    found += [
        f"{k} {values[k]} never trained on {domain} (trained: {', '.join(trained[k])})"
        for k in LISTED
        if str(values[k]) not in trained[k]
    ]
    return found
