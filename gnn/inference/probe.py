"""A machine's correction from its probe runs (collect.probe): what its fingerprint did not carry, without retraining.

A probe run's residual r = log(measured time / predicted time) is the machine's common shift plus the run's own
deviation (a sitting moves plans unevenly, and the model errs per plan). With a normal prior on the shift, of sd
tau (how far sittings of the training machine moved from each other, at the same fingerprint-carried prices),
and a per-run deviation of sd sigma, the shift's posterior after n runs is

    mean = sum(r) / (n + lam),   sd = sigma / sqrt(n + lam),   lam = (sigma / tau)^2

so one run moves a prediction part of the way and ten nearly all of it, and the 80% intervals widen by the
posterior's sd, which shrinks as runs are added. tau and sigma are learned at training (shift_prior, stored in
the ensemble's ``machine_shift``); memory is left alone (sittings do not move it: data/README.md, Sittings).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from collect.store import ResultStore

Z_UPPER = 1.2815515655446004  # the standard normal's 90th percentile: an 80% interval's half-width in sds
PROBE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
RUNS_DIR = "data/runs"  # where collect stores sweeps, probes among them
MIN_SITTINGS, MIN_SHARED_PLANS = 3, 10  # what shift_prior needs to say anything


@dataclass(frozen=True)
class MachineCorrection:
    """The log-time shift a probe found, its posterior sd, and how many runs it rests on."""

    shift: float
    sd: float
    runs: int
    probe: str = ""

    @classmethod
    def fit(cls, residuals: np.ndarray, tau: float, sigma: float, probe: str = "") -> "MachineCorrection":
        r = np.asarray(residuals, dtype=float)
        r = r[np.isfinite(r)]
        lam = (sigma / tau) ** 2 if math.isfinite(tau) and tau > 0 else 0.0  # no prior: the runs' own mean
        if len(r) + lam == 0:
            return cls(0.0, float("inf"), 0, probe)
        return cls(float(r.sum() / (len(r) + lam)), float(sigma / math.sqrt(len(r) + lam)), len(r), probe)

    @property
    def factor(self) -> float:
        return math.exp(self.shift)

    def apply(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The time point moved by the shift; each side of its interval widened by the shift's own doubt."""
        out = dict(columns)
        t, lo, hi = (np.asarray(columns[k], dtype=float) for k in ("iter_time_s", "iter_time_lo_s", "iter_time_hi_s"))
        doubt = (Z_UPPER * self.sd) ** 2 if math.isfinite(self.sd) else 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            below, above = np.log(t / lo), np.log(hi / t)
        point = t * self.factor
        out["iter_time_s"] = point
        out["iter_time_lo_s"] = point * np.exp(-np.sqrt(below**2 + doubt))
        out["iter_time_hi_s"] = point * np.exp(np.sqrt(above**2 + doubt))
        return out

    def summary(self) -> dict:
        return {"probe": self.probe, "runs": self.runs, "time_factor": self.factor, "log_sd": self.sd}


def probe_path(name: str, runs_dir: str | Path = RUNS_DIR) -> Path:
    """Where a probe's rows are: NAME in runs_dir (as collect.probe stores them). ValueError naming the field."""
    if not PROBE_NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"probe: {name[:100]!r} is not a probe name (letters, digits, '.', '_', '-'; up to 100)")
    path = Path(runs_dir) / f"{name}.parquet"
    if not path.exists() and not path.with_suffix(".journal.jsonl").exists():
        raise ValueError(f"probe: no runs named {name!r} in {runs_dir} (python -m collect probe makes them)")
    return path


def load_probe(name: str, runs_dir: str | Path = RUNS_DIR) -> pd.DataFrame:
    """The measured rows of a probe (collect.probe's NAME, in runs_dir)."""
    rows = ResultStore(probe_path(name, runs_dir)).load()
    ok = (rows["status"] == "ok") & ~rows["is_reference"].fillna(False).astype(bool) if len(rows) else []
    rows = rows[ok] if len(rows) else rows
    if not len(rows):
        raise ValueError(f"probe: {name!r} holds no run that finished (status ok)")
    return rows


def shift_prior(meta: pd.DataFrame) -> np.ndarray:
    """[device class: CPU, CUDA][tau, sigma] from training rows: plans measured in several sittings (fingerprints)
    of one machine. A plan's shift in a sitting is its log time there less its mean over sittings; tau is the sd of
    the sittings' median shifts, sigma the robust sd of plans around their sitting's median. NaN where no machine
    has MIN_SITTINGS sittings sharing MIN_SHARED_PLANS plans (the GPU rows: one sitting per source)."""
    out = np.full((2, 2), np.nan)
    ok = meta[(meta["status"] == "ok") & meta["fingerprint_id"].notna()]
    for cls, rows in ok.groupby(ok["device"] == "cuda"):
        per = rows.groupby(["run_id", "fingerprint_id"])["iter_time_s"].median().map(math.log).rename("x")
        per = per.reset_index()
        per = per[per.groupby("run_id")["fingerprint_id"].transform("nunique") >= 2]
        per["shift"] = per["x"] - per.groupby("run_id")["x"].transform("mean")
        counts = per.groupby("fingerprint_id").size()
        per = per[per["fingerprint_id"].isin(counts[counts >= MIN_SHARED_PLANS].index)]
        if per["fingerprint_id"].nunique() < MIN_SITTINGS:
            continue
        sitting = per.groupby("fingerprint_id")["shift"].transform("median")
        medians = per.groupby("fingerprint_id")["shift"].median()
        out[int(cls)] = (float(medians.std(ddof=1)), float(1.4826 * (per["shift"] - sitting).abs().median()))
    return out


def fit_correction(predictor, rows: pd.DataFrame, probe: str = "") -> MachineCorrection:
    """The correction a predictor (gnn.inference.predictor.BatchPredictor) takes from probe rows: its own
    predictions of them, against what they measured, under the prior it learned at training."""
    predicted = predictor.predict_rows(rows)["iter_time_s"].to_numpy(dtype=float)
    residuals = np.log(rows["iter_time_s"].to_numpy(dtype=float) / predicted)
    cls = int((rows["device"] == "cuda").any())
    ensemble = predictor.ensemble
    tau, plan_sd = (float(v) for v in ensemble.machine_shift[cls])
    # a run's deviation from the common shift: how unevenly sittings move plans, and the model's own error on a
    # plan (the calibration rows' median absolute error, as a normal's sd)
    model_sd = 1.4826 * float(ensemble.spread_floor[cls, 0])
    sigma = math.hypot(plan_sd if math.isfinite(plan_sd) else 0.0, model_sd)
    return MachineCorrection.fit(residuals, tau, sigma, probe)
