"""A machine's correction from its probe runs (collect.probe): what its fingerprint did not carry, without retraining.

A probe run's residual r = log(measured time / predicted time) is the machine's common shift, plus a shift of its
world size's (a sitting moves one rank alone, two ranks sharing the cores and four oversubscribing them by
different amounts), plus the run's own deviation (plans move unevenly, and the model errs per plan). As a Gaussian
process over runs, covariance tau^2 (any two runs) + tau_ws^2 (runs of one world size) + sigma^2 (a run with
itself), the shift at a plan's world size w after the runs r has

    mean = k_w' K^-1 r,   var = tau^2 + tau_ws^2 - k_w' K^-1 k_w,   k_w = tau^2 + tau_ws^2 [ws_i = w]

so one run moves a prediction part of the way and ten nearly all of it, a world size the probe ran moves more
than one it did not, and the 80% intervals widen by the shift's posterior sd, which narrows as runs are added.
tau, tau_ws and sigma are learned at training from sittings of one machine (shift_prior, stored in the ensemble's
``machine_shift``); memory is left alone (sittings do not move it: data/README.md, Sittings).
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
MAX_PROBE_RUNS = 32  # a probe is a few plans: naming a whole sweep would make one request predict thousands
MIN_SITTINGS, MIN_SHARED_PLANS = 3, 10  # what shift_prior needs to say anything
VAGUE_TAU = 1.0  # a model without a sittings prior: a machine may be e times faster or slower, the runs decide


@dataclass(frozen=True)
class MachineCorrection:
    """A probe's runs (their log residuals and world sizes) under a prior (tau, tau_ws, sigma)."""

    residuals: tuple[float, ...]
    world_sizes: tuple[int, ...]
    prior: tuple[float, float, float]
    probe: str = ""
    prior_doubt: float = 0.0  # the sd of the shift the intervals already hold (new_source's tau): replaced, not added
    slope_sd: float = 0.0  # how far a source's shift drifts per doubling of GPUs away from where it was probed

    @property
    def runs(self) -> int:
        return len(self.residuals)

    def _prior(self) -> tuple[float, float, float]:
        tau, tau_ws, sigma = self.prior
        return (tau if math.isfinite(tau) else VAGUE_TAU, tau_ws if math.isfinite(tau_ws) else 0.0, sigma)

    def shift(self, world_sizes) -> tuple[np.ndarray, np.ndarray]:
        """(posterior mean, posterior sd) of the log-time shift at each of ``world_sizes``."""
        w = np.asarray(world_sizes).reshape(-1)
        tau, tau_ws, sigma = self._prior()
        if not self.runs:
            return np.zeros(len(w)), np.full(len(w), math.hypot(tau, tau_ws))
        ws, r = np.asarray(self.world_sizes), np.asarray(self.residuals, dtype=float)
        mean, _ = self._posterior(ws, r, w, 0.0)
        _, var = self._posterior(ws, r, w, self.slope_sd)
        # never more doubt than no probe at all: tau was measured across sources at their own scales, trend and all
        return mean, np.sqrt(np.clip(var, 0.0, tau**2 + tau_ws**2))

    def _posterior(self, ws: np.ndarray, r: np.ndarray, w: np.ndarray, slope_sd: float):
        """The shift's posterior mean and variance at world sizes ``w``, with a trend in log2 GPUs about the
        probe's own scale of prior sd ``slope_sd`` per doubling. The point takes none (a slope fitted on a probe's
        few cheapest runs moved the rest the wrong way as often as the right one: docs/new-cluster.md); the doubt
        takes it: a shift found on small runs is less sure on large ones."""
        tau, tau_ws, sigma = self._prior()
        x, xt = np.log2(ws) - np.log2(ws).mean(), np.log2(np.maximum(w, 1)) - np.log2(ws).mean()
        trend = slope_sd**2
        K = tau**2 + tau_ws**2 * (ws[:, None] == ws[None, :]) + trend * np.outer(x, x) + sigma**2 * np.eye(len(ws))
        k = tau**2 + tau_ws**2 * (w[:, None] == ws[None, :]) + trend * np.outer(xt, x)  # [targets, runs]
        solved = np.linalg.solve(K, k.T)  # [runs, targets]
        return solved.T @ r, tau**2 + tau_ws**2 + trend * xt**2 - np.einsum("tr,rt->t", k, solved)

    def apply(self, columns: dict[str, np.ndarray], world_sizes) -> dict[str, np.ndarray]:
        """The time point moved by its world size's shift; each side of its interval widened by the shift's doubt."""
        out = dict(columns)
        t, lo, hi = (np.asarray(columns[k], dtype=float) for k in ("iter_time_s", "iter_time_lo_s", "iter_time_hi_s"))
        mean, sd = self.shift(np.broadcast_to(np.asarray(world_sizes), t.shape))
        doubt, held = (Z_UPPER * sd) ** 2, (Z_UPPER * self.prior_doubt) ** 2
        with np.errstate(divide="ignore", invalid="ignore"):
            below, above = (np.sqrt(np.maximum(np.log(x) ** 2 - held, 0.0)) for x in (t / lo, hi / t))
        point = t * np.exp(mean)
        out["iter_time_s"] = point
        out["iter_time_lo_s"] = point * np.exp(-np.sqrt(below**2 + doubt))
        out["iter_time_hi_s"] = point * np.exp(np.sqrt(above**2 + doubt))
        return out

    def summary(self, world_size: int) -> dict:
        """What a response says of the correction at its cluster's world size."""
        mean, sd = self.shift([world_size])
        return {"probe": self.probe, "runs": self.runs, "time_factor": float(np.exp(mean[0])), "log_sd": float(sd[0])}


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
    if len(rows):  # the world sizes' reference plans are measured too, as in every sweep: not the probe's own
        rows = rows[(rows["status"] == "ok") & ~rows["is_reference"].fillna(False).astype(bool)]
    if not len(rows):
        raise ValueError(f"probe: {name!r} holds no run that finished (status ok)")
    if len(rows) > MAX_PROBE_RUNS:
        raise ValueError(f"probe: {name!r} holds {len(rows)} runs, more than a probe's {MAX_PROBE_RUNS}: not a probe")
    return rows


def hardware_kind(record: dict) -> str:
    """What a hardware record (a preset or a fingerprint) is, as rows name it: its device kind (a100, h200),
    or its device where it has none (cpu)."""
    return str(record.get("device_kind") or record.get("device"))


def check_probe(name: str, kind: str, any_hardware: bool = False, runs_dir: str | Path = RUNS_DIR) -> None:
    """Before any prediction: ValueError naming the probe field when ``name`` names no runs, more runs than a probe
    has (a stored sweep), or runs measured on other hardware than ``kind`` (hardware_kind of the request's cluster;
    a V100's runs would move A100 predictions by the V100's own error), unless ``any_hardware``."""
    rows = load_probe(name, runs_dir)
    measured = sorted(set(rows["device_kind"].fillna(rows["device"]).astype(str)))
    if not any_hardware and measured != [kind]:
        raise ValueError(
            f"probe: {name!r} was measured on {', '.join(measured)}, and the request's cluster is {kind}: a probe "
            "corrects predictions for the machine it ran on (set probe_any_hardware to apply it anyway)"
        )


def shift_prior(meta: pd.DataFrame) -> np.ndarray:
    """[device class: CPU, CUDA][tau, tau_ws, sigma] from training rows: plans measured in several sittings
    (fingerprints) of one machine. A plan's shift in a sitting is its log time there less its mean over sittings;
    tau is the sd of the sittings' median shifts, tau_ws that of their world sizes' medians about them, sigma the
    robust sd of plans about their (sitting, world size) median. NaN where no machine has MIN_SITTINGS sittings
    sharing MIN_SHARED_PLANS plans (the GPU rows: one sitting per source)."""
    out = np.full((2, 3), np.nan)
    ok = meta[(meta["status"] == "ok") & meta["fingerprint_id"].notna() & meta["iter_time_s"].notna()]
    for cls, rows in ok.groupby(ok["device"] == "cuda"):
        per = rows.groupby(["run_id", "fingerprint_id", "world_size"])["iter_time_s"].median().map(math.log)
        per = per.rename("x").reset_index()
        per = per[per.groupby("run_id")["fingerprint_id"].transform("nunique") >= 2]
        per["shift"] = per["x"] - per.groupby("run_id")["x"].transform("mean")
        counts = per.groupby("fingerprint_id").size()
        per = per[per["fingerprint_id"].isin(counts[counts >= MIN_SHARED_PLANS].index)]
        if per["fingerprint_id"].nunique() < MIN_SITTINGS:
            continue
        sitting = per.groupby("fingerprint_id")["shift"].median()
        cell = per.groupby(["fingerprint_id", "world_size"])["shift"].median()
        by_ws = cell - sitting.reindex(cell.index.get_level_values(0)).to_numpy()
        around = per["shift"] - per.groupby(["fingerprint_id", "world_size"])["shift"].transform("median")
        out[int(cls)] = (float(sitting.std(ddof=1)), float(by_ws.std(ddof=1)), float(1.4826 * around.abs().median()))
    return out


def fit_correction(predictor, rows: pd.DataFrame, probe: str = "") -> MachineCorrection:
    """The correction a predictor (gnn.inference.predictor.BatchPredictor) takes from probe rows: its own
    predictions of them, against what they measured, under the prior it learned at training."""
    predicted = predictor.predict_rows(rows)["iter_time_s"].to_numpy(dtype=float)
    residuals = np.log(rows["iter_time_s"].to_numpy(dtype=float) / predicted)
    keep = np.isfinite(residuals)
    cls = int((rows["device"] == "cuda").any())
    world_sizes = rows["world_size"].to_numpy(dtype=int)[keep]
    learned = predictor.info.get("new_source", {}).get("time")
    if cls and learned:  # how whole sources moved, and plans within them (gnn.inference.new_source)
        prior = (learned["tau"], 0.0, learned["within"] / Z_UPPER)
        runs, sizes, slope = tuple(residuals[keep].tolist()), tuple(world_sizes.tolist()), learned.get("slope_sd", 0.0)
        return MachineCorrection(runs, sizes, prior, probe, prior_doubt=prior[0], slope_sd=slope)
    ensemble = predictor.ensemble
    tau, tau_ws, plan_sd = (float(v) for v in ensemble.machine_shift[cls])
    # a run's own deviation: how unevenly sittings move plans, and the model's own error on a plan (the
    # calibration rows' median absolute error, as a normal's sd)
    model_sd = 1.4826 * float(ensemble.spread_floor[cls, 0])
    sigma = math.hypot(plan_sd if math.isfinite(plan_sd) else 0.0, model_sd)
    return MachineCorrection(tuple(residuals[keep].tolist()), tuple(world_sizes.tolist()), (tau, tau_ws, sigma), probe)
