"""What bounds a prediction, and how far outside its training rows it lies: the limits of the 80% intervals.

An interval is the ensemble's calibrated width, widened where the plan lies outside the training rows, then held
inside two limits:

- **Floor (physics).** No step is faster than its compute at the device's peak: 6 FLOPs per non-embedding
  parameter a token meets (a moe's active ones; the input embedding is a lookup, no matmul) per token of the
  global batch, over the GPUs at their datasheet (or fingerprinted) peak for the dtype, twice that in FP8. Every
  measured run in data/ takes at least twice it (the closest: NVIDIA's FP8 405B runs on GB300, at 1.97 times).
- **Memory's floor (physics).** No GPU holds less than its even share of the weights, in their stored dtype (a
  byte with FP8 GEMMs, whose weights may be FP8 only), and of AdamW's two moments, in bf16 at the least: a rank
  holds at least params x (weight bytes + 4) / GPUs. A member never trained on a model's memory must not say less.
- **Ceiling (physics times the worst seen).** No step is slower than its serial work: every pipeline stage's
  compute and traffic one after the other, pp x (compute + communication) of the busiest rank, or the fitted
  analytical model where that is larger (it prices Nanotron's latency per layer, which the simulator does not),
  times the largest ratio of measured time to that on the calibration rows of the device class. Software stalls
  do not follow datasheets (a 1.3B Nanotron pipeline of 128 micro-batches ran 70 times its simulated time), so the
  factor is measured, not assumed; memory's ceiling is the simulator's peak times the largest ratio seen.
- **Distance.** How many doublings a plan lies outside its domain's training rows, summed over model size, layers,
  width, sequence, micro-batch, GPUs and the dp / tp / pp degrees; per target, against the rows that measured it
  (a fake trace extends memory's range, never time's). The interval widens by ``widen`` log units per
  doubling: the growth of the analytical model's error when the largest scale and the largest model of the
  training rows are held out of its fit in turn (gnn.predictors.nested), not an assumed constant.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

# the flat features the limits read (unstandardised, as the batch carries them)
COLUMNS = (
    "f_log_active_params",
    "f_log_vocab",
    "f_log_hidden",
    "f_log_mbs",
    "f_log2_num_microbatches",
    "f_log_seq",
    "f_log2_dp",
    "f_log_world",
    "f_log_flops_per_s",
    "f_float8",
    "f_log2_pp",
    "f_log_sim_compute",
    "f_log_sim_comm",
    "f_log_sim_mem",
    "f_cuda",
    "f_dtype_bytes",
)
# the quantities whose training range a plan's distance is measured against, and whether each is a natural log
# (else a log2) of its value: distance is counted in doublings
RANGED = (
    ("f_log_params", True),
    ("f_log_layers", True),
    ("f_log_hidden", True),
    ("f_log_seq", True),
    ("f_log_mbs", False),
    ("f_log_world", False),
    ("f_log2_dp", False),
    ("f_log2_tp", False),
    ("f_log2_pp", False),
)
WORLD, PARAMS = 5, 0  # RANGED's world size and parameter count: the nested checks' scale and size
LN2 = math.log(2.0)
MIN_MOMENT_BYTES = 2  # an AdamW moment in bf16 (plan.optimizer_state_dtype), the least any framework keeps
ROUNDING = 1e-3  # doublings: the ranges are stored in float32, a plan on a range's edge is inside it


class Limits(nn.Module):
    """The floor, ceiling and distance of each plan, from its flat features ``u`` (gnn.model.intervals.bounds)."""

    def __init__(self, feature_names: list[str] | None = None, domain_names: list[str] | None = None):
        super().__init__()
        names = list(feature_names or [])
        self.enabled = all(c in names for c in COLUMNS) and all(c in names for c, _ in RANGED)
        self.index = [names.index(c) for c in COLUMNS] if self.enabled else []
        self.ranged = [names.index(c) for c, _ in RANGED] if self.enabled else []
        self.domain_names = list(domain_names or [])
        # log of the largest measured / reference ratio seen, [device class][time, memory]: inf until calibrated
        self.register_buffer("ceiling", torch.full((2, 2), float("inf")))
        # log units the interval widens by per doubling outside the training rows, [device class][time, memory]
        self.register_buffer("widen", torch.zeros(2, 2))
        # each domain's training range of RANGED, in doublings: [domain][time, memory][quantity][lo, hi]
        self.register_buffer("ranges", torch.zeros(len(self.domain_names), 2, len(RANGED), 2))

    def columns(self, u: torch.Tensor) -> np.ndarray:
        """[n, len(COLUMNS) + len(RANGED)]: what the limits need of a batch's flat features."""
        if not self.enabled:
            return np.zeros((u.shape[0], 0))
        if u.shape[0] == 0:
            return np.zeros((0, len(self.index) + len(self.ranged)))
        return u[:, self.index + self.ranged].double().numpy()

    def floor_s(self, cols: np.ndarray) -> np.ndarray:
        """Seconds of compute at peak per GPU: the fastest any step of the plan can be."""
        c = dict(zip(COLUMNS, cols[:, : len(COLUMNS)].T))
        params = np.maximum(np.exp(c["f_log_active_params"]) - np.exp(c["f_log_vocab"] + c["f_log_hidden"]), 0.0)
        tokens = 2 ** c["f_log_mbs"] * 2 ** c["f_log2_num_microbatches"] * np.exp(c["f_log_seq"]) * 2 ** c["f_log2_dp"]
        peak = np.exp(c["f_log_flops_per_s"]) * (1 + c["f_float8"])
        return 6 * params * tokens / (2 ** c["f_log_world"] * peak)

    def floor_mem_bytes(self, cols: np.ndarray) -> np.ndarray:
        """Bytes every GPU holds at the least: its even share of the weights and of AdamW's moments."""
        c = dict(zip(COLUMNS, cols[:, : len(COLUMNS)].T))
        params = np.exp(cols[:, len(COLUMNS) + PARAMS])
        weight = np.where(c["f_float8"] > 0.5, 1.0, c["f_dtype_bytes"])
        return params * (weight + 2 * MIN_MOMENT_BYTES) / 2 ** c["f_log_world"]

    def references(self, cols: np.ndarray, base_time: np.ndarray) -> np.ndarray:
        """[n, 2] the log references the ceiling multiplies: the serial work (or the fitted model where larger) for
        time, the simulator's peak for memory."""
        c = dict(zip(COLUMNS, cols[:, : len(COLUMNS)].T))
        serial = 2 ** c["f_log2_pp"] * (np.exp(c["f_log_sim_compute"]) + np.exp(c["f_log_sim_comm"]))
        with np.errstate(invalid="ignore"):
            time = np.fmax(np.log(serial), base_time)  # fmax: a NaN base (no analytical model) keeps the serial sum
        return np.column_stack([time, c["f_log_sim_mem"]])

    def limits(self, cols: np.ndarray, classes: np.ndarray, base_time: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([n, 2] log floor, [n, 2] log ceiling) of (time, memory)."""
        n = len(classes)
        if not self.enabled:
            return np.full((n, 2), -np.inf), np.full((n, 2), np.inf)
        with np.errstate(divide="ignore"):
            floor = np.column_stack([np.log(self.floor_s(cols)), np.log(self.floor_mem_bytes(cols))])
        return floor, self.references(cols, base_time) + self.ceiling.numpy()[classes]

    def fit_ceiling(self, cols, classes, base_time, log_time, log_mem) -> None:
        """The largest log(measured / reference) per device class and target over calibration rows."""
        if not self.enabled:
            return
        excess = np.column_stack([log_time, log_mem]) - self.references(cols, base_time)
        ceiling = np.full((2, 2), np.inf)
        for c in (0, 1):
            for j in (0, 1):
                seen = excess[(classes == c) & np.isfinite(excess[:, j]), j]
                if len(seen):
                    ceiling[c, j] = max(float(seen.max()), 0.0)
        self.ceiling.copy_(torch.tensor(ceiling, dtype=torch.float32))

    def fit_ranges(self, cols: np.ndarray, domains: list[str], measured: np.ndarray | None = None) -> None:
        """Each domain's training range of the RANGED quantities per target (from the training rows' columns), over
        the rows that measured it (``measured`` [n, 2], all rows if None; a domain no row of which measured a target
        takes its range over all its rows)."""
        if not self.enabled:
            return
        doublings = self._doublings(cols)
        names = np.asarray(domains, dtype=object)
        measured = np.ones((len(names), 2), dtype=bool) if measured is None else np.asarray(measured, dtype=bool)
        self.domain_names = sorted(set(str(d) for d in domains))
        ranges = []
        for d in self.domain_names:
            for j in (0, 1):
                rows = doublings[(names == d) & measured[:, j]] if ((names == d) & measured[:, j]).any() else None
                rows = doublings[names == d] if rows is None else rows
                ranges.append(np.stack([rows.min(0), rows.max(0)], 1))
        self.ranges = torch.tensor(np.array(ranges).reshape(-1, 2, len(RANGED), 2), dtype=torch.float32)

    def distance(self, cols: np.ndarray, domains: list[str] | None) -> np.ndarray:
        """[n, time / memory] doublings outside each plan's domain's training range, summed over the RANGED
        quantities; a domain never trained on is measured against the union of the ranges trained on."""
        if not self.enabled or not self.domain_names:
            return np.zeros((cols.shape[0], 2))
        x, own = self._doublings(cols)[:, None], self._own_ranges(domains, cols.shape[0])
        beyond = np.maximum(x - own[..., 1], 0) + np.maximum(own[..., 0] - x, 0)
        return np.where(beyond > ROUNDING, beyond, 0.0).sum(2)

    def beyond_largest(self, cols: np.ndarray, domains: list[str] | None) -> np.ndarray:
        """[n, check, target] whether each plan lies beyond its domain's largest scale (world size) and largest model
        (parameters) trained on, for time and for memory: the nested checks' two ranges
        (gnn.predictors.nested.correction_gates)."""
        if not self.enabled or not self.domain_names:
            return np.zeros((cols.shape[0], 2, 2), dtype=bool)
        x, hi = self._doublings(cols)[:, None], self._own_ranges(domains, cols.shape[0])[..., 1]
        return np.stack([x[:, :, i] > hi[:, :, i] + ROUNDING for i in (WORLD, PARAMS)], 1)

    def _own_ranges(self, domains: list[str] | None, n: int) -> np.ndarray:
        """[n, target, quantity, lo/hi] each plan's domain's ranges, or the union of all for a domain never trained
        on."""
        ranges = self.ranges.numpy()
        union = np.stack([ranges[..., 0].min(0), ranges[..., 1].max(0)], -1)
        index = {name: i for i, name in enumerate(self.domain_names)}
        own = np.array([ranges[index[d]] if d in index else union for d in (domains or [None] * n)])
        return own.reshape(n, 2, len(RANGED), 2)

    def _doublings(self, cols: np.ndarray) -> np.ndarray:
        ranged = cols[:, len(COLUMNS) :]
        return np.column_stack([ranged[:, i] / (LN2 if ln else 1.0) for i, (_, ln) in enumerate(RANGED)])
