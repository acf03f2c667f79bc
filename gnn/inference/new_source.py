"""What a prediction's interval says on a source never trained on, calibrated by leaving whole sources out.

A source is one public table, or one cluster under one framework (gnn.dataset.splits.source_of). On a source the
model never saw, a run's log error is the source's shift (its network, its framework's version, its stragglers)
plus the run's own deviation within it. experiments.sources.loso trains a model without each source in turn and
predicts that source's runs; from those residuals, per target (time, memory), each source weighing the same
whatever its size:

- ``tau``: the root mean square of the sources' median log errors: how far whole sources moved. Sources moved both
  ways (the Playbook's Nanotron runs 1.5x slower than predicted at the median, the H200 sweep's 1.4x faster), and
  moving every point by their mean made the held-out sources' median error worse, not better: points stay, and the
  mean's offset is part of the doubt;
- ``within``: the 80% quantile of a run's |log error - its source's median|: how unevenly plans within a source
  moved;
- ``slope_sd``: the root mean square of the sources' slopes of log error per doubling of GPUs (least squares,
  over the sources that ran more than one world size): how far a shift found at one scale carries to another.

A GPU plan asked about with no probe gets an 80% half-width of sqrt(within^2 + (z tau)^2) in log units about its
point, never narrower than its in-distribution interval. A probe's runs narrow the source's part: under the same
prior, the shift's posterior sd replaces tau (gnn.inference.probe.MachineCorrection), growing with the doublings
between the probe's GPUs and the plan's at slope_sd. CPU plans keep their
in-distribution interval: the CPU sittings are their own prior (gnn.inference.probe.shift_prior).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gnn.inference.probe import Z_UPPER

COVERAGE = 0.8
TARGETS = {"time": ("iter_time_s", "pred_time_s"), "memory": ("peak_mem_bytes", "pred_mem_bytes")}
MIN_SOURCES = 3  # fewer held-out sources say little about how sources differ (memory: the Playbook and the H200)
NAME = "leave-one-source-out"
INTERVALS = {
    "time": ("iter_time_s", "iter_time_lo_s", "iter_time_hi_s"),
    "memory": ("peak_mem_bytes", "peak_mem_lo_bytes", "peak_mem_hi_bytes"),
}


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The smallest value whose cumulative weight reaches q of the total."""
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, q * cum[-1])])


def residuals(rows: pd.DataFrame, target: str) -> pd.DataFrame:
    """[source, r, doublings]: log(measured / predicted) of each held-out run that measured ``target``, and log2 of
    its GPUs."""
    measured, predicted = TARGETS[target]
    ok = (rows["status"] == "ok") & rows[measured].notna() & rows[predicted].notna()
    r = np.log(rows.loc[ok, measured].astype(float) / rows.loc[ok, predicted].astype(float))
    doublings = np.log2(rows.loc[ok, "world_size"].astype(float)).to_numpy()
    return pd.DataFrame({"source": rows.loc[ok, "source"].to_numpy(), "r": r.to_numpy(), "doublings": doublings})


def fit(rows: pd.DataFrame, coverage: float = COVERAGE) -> dict:
    """{target: {"tau", "within", "sources"}} from leave-one-source-out rows (experiments.sources.loso's
    columns: source, status, the measured targets, pred_time_s, pred_mem_bytes); a target fewer than MIN_SOURCES
    sources measured is left out."""
    out = {}
    for target in TARGETS:
        res = residuals(rows, target)
        medians = res.groupby("source")["r"].median()
        if len(medians) < MIN_SOURCES:
            continue
        deviation = (res["r"] - res["source"].map(medians)).abs().to_numpy()
        weight = 1.0 / res["source"].map(res["source"].value_counts()).to_numpy()
        out[target] = {
            "tau": float(np.sqrt((medians**2).mean())),
            "slope_sd": _slope_sd(res),
            "within": weighted_quantile(deviation, weight, coverage),
            "sources": sorted(medians.index),
        }
    return out


def _slope_sd(res: pd.DataFrame) -> float:
    groups = [g for _, g in res.groupby("source") if g["doublings"].nunique() > 1]
    slopes = [np.polyfit(g["doublings"], g["r"], 1)[0] for g in groups]
    return float(np.sqrt(np.mean(np.square(slopes)))) if slopes else 0.0


def half_width(calibration: dict, source_sd: np.ndarray | float | None = None) -> np.ndarray | float:
    """The 80% half-width in log units on a new source: the source's doubt (tau, or a probe's posterior sd) and
    the run's own deviation within it."""
    sd = calibration["tau"] if source_sd is None else source_sd
    return np.sqrt(calibration["within"] ** 2 + (Z_UPPER * np.asarray(sd)) ** 2)


def widen(columns: dict[str, np.ndarray], calibration: dict, time_sd=None) -> dict[str, np.ndarray]:
    """Prediction columns (iter_time_s, iter_time_lo_s, ...; peak_mem_*) of plans on a GPU cluster never trained
    on: each interval at least the leave-one-source-out half-width about its point. ``time_sd``: the sd of the
    source's time shift in place of tau, per plan (a probe's posterior: experiments.sources.report)."""
    out = dict(columns)
    for target, (point, lo, hi) in INTERVALS.items():
        c = calibration.get(target)
        if c is None or point not in columns:
            continue
        p, half = np.asarray(columns[point], dtype=float), half_width(c, time_sd if target == "time" else None)
        with np.errstate(divide="ignore", invalid="ignore"):
            below = np.maximum(np.log(p / np.asarray(columns[lo], dtype=float)), half)
            above = np.maximum(np.log(np.asarray(columns[hi], dtype=float) / p), half)
        out[lo], out[hi] = p * np.exp(-below), p * np.exp(above)
    return out
