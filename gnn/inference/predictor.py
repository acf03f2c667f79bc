"""Batched prediction for plans: specs in, time / memory / fits / interval / breakdown out.

The one path every consumer takes (evaluation, the MLflow pyfunc model, the CLI and HTTP service, the plan
search): compile each plan's execution graph on the named hardware, simulate it for the physics features
(gnn.inference.workers, on a process pool for large batches), and run the ensemble over the batch.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from collect.fake.device import allocatable
from collect.hardware.records import load_hardware
from collect.schema import RunSpec
from gnn import cancel
from gnn.dataset.features import NODE_DIM
from gnn.dataset.rows import domain_of, row_to_spec
from gnn.dataset.splits import fake_part, is_fake
from gnn.inference import new_source
from gnn.inference.coverage import outside, spec_values
from gnn.inference.workers import WARM_UP_HARDWARE, FeaturizerPool, default_workers, warm_up_spec
from gnn.model import checkpoint
from gnn.model.ensemble import Ensemble

# a prediction's point values, 80% intervals and fit, in the order the service and the pyfunc model report them
POINT_COLUMNS = (
    "iter_time_s",
    "iter_time_lo_s",
    "iter_time_hi_s",
    "peak_mem_bytes",
    "peak_mem_lo_bytes",
    "peak_mem_hi_bytes",
    "fits",
    "oom_risk",
)
# the standard normal quantile of the 80% interval's upper end (0.9): an interval's half-width in log units is this
# many standard deviations of a log-normal error
Z_UPPER = 1.2815515655446004


FITS_MAX_RISK = 0.1
"""A plan fits when its chance of running out of memory (oom_risk) is at most this: its whole 80% memory interval
is within what the device can allocate (collect.fake.device.allocatable: its memory less what a GPU holds beyond
its tensors). The one answer to "does it fit": the search's default max_oom_risk too."""

SIM_COLUMNS = ("sim_time_s", "sim_compute_s", "sim_bubble_s", "sim_exposed_s", "sim_comm_s")


def oom_risk(point: np.ndarray, hi: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """The chance the peak exceeds the capacity, read from the memory interval as a log-normal error: its upper
    end (the 90th percentile) sets the spread. A plan whose whole interval fits has a risk below 10%."""
    with np.errstate(divide="ignore", invalid="ignore"):
        sigma = np.log(hi / point) / Z_UPPER
        z = np.log(capacity / point) / sigma
    tail = 0.5 * _erfc(np.nan_to_num(z, nan=0.0) / math.sqrt(2.0))  # the normal's upper tail (scipy would load ~1 s)
    return np.where(sigma > 0, tail, (point > capacity).astype(float))


_erfc = np.vectorize(math.erfc, otypes=[float])


class BatchPredictor:
    """An ensemble ready to predict plans on any hardware record under ``hardware_dir``."""

    def __init__(self, ensemble: Ensemble, hardware_dir: str | Path = "data/hardware", info: dict | None = None):
        self.ensemble = ensemble.eval()
        self.hardware_dir = str(hardware_dir)
        self.info = info or {}  # which model: name, version, run id, validation metrics
        self.__setstate__(self.__dict__)

    def __getstate__(self):
        # the worker pool does not travel with the model
        return {k: v for k, v in self.__dict__.items() if k != "pool"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.pool = FeaturizerPool(self.hardware_dir)

    def start_workers(self, workers: int | None = None) -> None:
        """Start the featurisation processes now (FeaturizerPool.start_workers)."""
        self.pool.start_workers(workers)

    def warm_up(self) -> None:
        """Featurise and predict one small plan in this process now (see warm_up_spec), so that the first
        request does not pay for loading the compiled kernels."""
        self.predict_columns([warm_up_spec()], WARM_UP_HARDWARE, workers=0)

    @property
    def workers_ready(self) -> int:
        """Featurisation processes known to be up (they have run a task)."""
        return self.pool.workers_ready

    def featurize(
        self, specs: list[RunSpec], hardware: str, flags: list[dict] | None = None, workers: int | None = None
    ):
        """(graph, flat features) per spec. ``flags`` mark assumed fields (rows.py); user plans state everything.
        ``workers``: featurisation processes, 0 to featurise inline, None for default_workers."""
        workers = default_workers(len(specs)) if workers is None else workers
        chunks = dict(self.pool.chunks(specs, hardware, flags, workers))
        return [item for i in sorted(chunks) for item in chunks[i].items()]

    def _check_layout(self, flat_names: tuple[str, ...]) -> None:
        """A model trained on another feature layout cannot read what this code makes of a plan: say so, rather
        than fail on a tensor shape."""
        member = self.ensemble.members[0]
        config = member.config
        trained = config.get("feature_names")
        flat_names = tuple(n for n in flat_names if n.startswith("f_"))  # the rest: simulator outputs, not inputs
        if (trained is not None and list(trained) != list(flat_names)) or config["node_dim"] != NODE_DIM:
            new = sorted(set(flat_names) - set(trained or ()))
            raise ValueError(
                f"this model was trained on another feature layout ({config['node_dim']} pass and "
                f"{config['global_dim']} plan features; this code makes {NODE_DIM} and {len(flat_names)}"
                + (f", new: {', '.join(new[:8])}" if new else "")
                + "): train it again on this code (make train)"
            )

    def predict(
        self,
        specs: list[RunSpec],
        hardware: str,
        flags: list[dict] | None = None,
        workers: int | None = None,
        calibrated_as: str | None = None,
    ) -> pd.DataFrame:
        """One row per spec, in order: point predictions, 80% intervals, fits, and the simulator's breakdown."""
        return pd.DataFrame(self.predict_columns(specs, hardware, flags, workers, calibrated_as=calibrated_as))

    def predict_columns(
        self,
        specs: list[RunSpec],
        hardware: str,
        flags: list[dict] | None = None,
        workers: int | None = None,
        should_stop=None,
        calibrated_as: str | None = None,
    ) -> dict[str, np.ndarray]:
        """predict() as a dict of columns: what the service uses, since a DataFrame costs ~ms per small request.
        ``should_stop``: asked between chunks and inside them (gnn.cancel); when it answers True, gnn.cancel.Cancelled
        is raised. ``calibrated_as``: the calibration domain whose interval factor applies, if not the hardware's
        (Ensemble.predict)."""
        with cancel.stop_when(should_stop):
            return self._predict_columns(specs, hardware, flags, workers, calibrated_as)

    def _predict_columns(self, specs, hardware, flags, workers, calibrated_as=None) -> dict[str, np.ndarray]:
        record = load_hardware(hardware, self.hardware_dir)  # an unknown name fails here, not in a worker
        domain = domain_of(record.get("device"), record.get("device_kind"))  # its interval factor and ranges
        parts = {}
        workers = default_workers(len(specs)) if workers is None else workers
        with self.pool.forward_threads(workers):
            for index, chunk in self.pool.chunks(specs, hardware, flags, workers):
                self._check_layout(chunk.flat_names)
                cancel.check(f"the prediction of {len(specs)} plans")
                n = len(chunk.flat)
                point = self.ensemble.predict_packed(chunk.packed(), [domain] * n, [calibrated_as or domain] * n)
                # the chunk's graphs are let go here: only its simulator columns are kept for the answer
                parts[index] = (point, {k: chunk.column(k) for k in SIM_COLUMNS})
        parts = [parts[i] for i in sorted(parts)]
        out = {k: np.concatenate([p[k] for p, _ in parts]) for k in parts[0][0]} if parts else self.ensemble.predict([])
        if self.calibration(record, calibrated_as) == new_source.NAME:
            out = new_source.widen(out, self.info["new_source"])
        out["memory_bytes"] = np.array([s.cluster.memory_bytes for s in specs], dtype=float)
        # the peak is what the tensors are allocated; the device holds more (the allocator's reserve, CUDA's context)
        usable = np.array([allocatable(s.cluster.memory_bytes, s.cluster.device) for s in specs], dtype=float)
        out["oom_risk"] = oom_risk(out["peak_mem_bytes"], out["peak_mem_hi_bytes"], usable)
        out["fits"] = out["oom_risk"] <= FITS_MAX_RISK
        del out["oom_prob"]  # the network's own classifier: scored in training, never a second answer to a user
        sim = {k: np.concatenate([c[k] for _, c in parts]) if parts else np.zeros(0) for k in SIM_COLUMNS}
        # where the time goes, per the simulator on the busiest rank (fractions of its iteration)
        total = sim["sim_time_s"]
        out["compute_frac"] = np.minimum(sim["sim_compute_s"] / total, 1.0)
        out["bubble_frac"] = sim["sim_bubble_s"] / total
        out["exposed_frac"] = sim["sim_exposed_s"] / total
        out["comm_s_at_full_bandwidth"] = sim["sim_comm_s"]
        out["extrapolation"] = self.extrapolation(specs, domain)
        return out

    def calibration(self, record: dict, calibrated_as: str | None = None) -> str:
        """Which calibration a plan's intervals take on hardware ``record``: a GPU cluster is never one the model was
        trained on, so where the model carries a leave-one-source-out calibration (gnn.inference.new_source) its
        plans take it; CPU plans and fake traces (``calibrated_as``) keep the in-distribution one."""
        if "new_source" in self.info and record.get("device") == "cuda" and not calibrated_as:
            return new_source.NAME
        return "in-distribution"

    def extrapolation(self, specs: list[RunSpec], domain: str) -> list[list[str] | None]:
        """Per spec, what of it lies outside the model's training rows on ``domain`` (gnn.inference.coverage);
        None for a model saved without its training range."""
        ranges = self.info.get("trained_range")
        if ranges is None:
            return [None] * len(specs)
        return [outside(spec_values(s), domain, ranges) for s in specs]

    def predict_rows(self, rows: pd.DataFrame) -> pd.DataFrame:
        """Predictions for rows in the data/runs format (each row names its hardware); a fake trace's interval is
        calibrated on fake traces (gnn.dataset.splits.calibration_domain)."""
        out, fake = [], fake_part(rows).where(is_fake(rows), "")
        for (hardware, calibrated_as), group in rows.groupby([rows["fingerprint_id"].fillna("a100-80gb"), fake]):
            parsed = [row_to_spec(r) for r in group.to_dict("records")]
            specs, flags = [p[0] for p in parsed], [p[2] for p in parsed]
            predicted = self.predict(specs, hardware, flags, calibrated_as=calibrated_as or None)
            out.append(predicted.set_index(group.index))
        return pd.concat(out).loc[rows.index] if out else pd.DataFrame()

    def save(self, path: str | Path) -> None:
        """Weights plus a JSON description (gnn.model.checkpoint): loading runs no code from the file."""
        checkpoint.save(path, self.ensemble, self.info)

    @classmethod
    def load(
        cls, path: str | Path, hardware_dir: str | Path = "data/hardware", recalibrate: bool = False
    ) -> "BatchPredictor":
        """``recalibrate``: the caller calibrates the ensemble again (gnn.model.checkpoint.load)."""
        ensemble, info = checkpoint.load(path, recalibrate)
        return cls(ensemble, hardware_dir, info)
