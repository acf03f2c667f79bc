"""The baselines, each fit on a split's training rows of one hardware domain (gnn.predictors.base):

- analytical: transformer formulas (FLOPs, collective volumes, activation and
  state bytes) combined with efficiencies fitted by non-negative least squares
  on relative error.
- simulator: the critical-path simulator over the execution graph, with one
  fitted scale for time and a scale plus offset for memory.
- physics: the same simulator fitted to nothing: what the costs alone say (on a GPU, the preset's kernel and
  NCCL pricing), untouched by how fast the training rows' framework happened to run.
- gbt: gradient-boosted trees on flat plan, workload and hardware features.
- rule_of_thumb: 6 x (active) parameters x tokens / (GPUs x datasheet peak x 0.40), fitted to nothing: the floor a GPU
  user already has, and the one any prediction must clear by far. GPU presets only (a CPU has no datasheet
  peak here); no memory.
- megatron_memory: Megatron-LM's theoretical memory per GPU (state and activations), fitted to nothing; no time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from collect.hardware.records import UnknownHardware, load_hardware
from gnn.costs.efficiency import relative_nnls, time_terms
from gnn.dataset.rows import ASSUMED_DTYPE, has_memory, has_time
from gnn.predictors.base import PLAN_FEATURES_PREFIX, SIM_FEATURES, Predictor

RULE_OF_THUMB_MFU = 0.40  # the rule's "40% of peak"


class AnalyticalPredictor(Predictor):
    name = "analytical"

    def fit(self, train, val=None):
        timed = train[has_time(train)]
        self.time_coef = relative_nnls(time_terms(timed), timed["iter_time_s"].to_numpy())
        mem = train[has_memory(train)]
        self.mem_coef = None
        if len(mem) >= 5:
            self.mem_coef = relative_nnls(self._mem_terms(mem), mem["peak_mem_bytes"].to_numpy(dtype=float))
        return self

    @staticmethod
    def _mem_terms(df: pd.DataFrame) -> np.ndarray:
        # closed-form parameter, gradient, optimizer and activation accounting (gnn.costs.analytic)
        return np.column_stack([np.exp(df["f_log_analytic_mem"]), np.ones(len(df))])

    def predict(self, rows):
        out = pd.DataFrame(index=rows.index)
        out["pred_time_s"] = time_terms(rows) @ self.time_coef
        out["pred_mem_bytes"] = self._mem_terms(rows) @ self.mem_coef if self.mem_coef is not None else np.nan
        return out


class SimulatorPredictor(Predictor):
    name = "simulator"

    def fit(self, train, val=None):
        timed = train[has_time(train)]
        ratio = np.log(timed["iter_time_s"]) - timed["f_log_sim_time"]
        self.time_scale = float(np.exp(np.median(ratio)))
        mem = train[has_memory(train)]
        self.mem_coef = None
        if len(mem) >= 5:
            design = np.column_stack([np.exp(mem["f_log_sim_mem"]), np.ones(len(mem))])
            self.mem_coef = relative_nnls(design, mem["peak_mem_bytes"].to_numpy(dtype=float))
        return self

    def predict(self, rows):
        out = pd.DataFrame(index=rows.index)
        out["pred_time_s"] = self.time_scale * np.exp(rows["f_log_sim_time"])
        out["pred_mem_bytes"] = (
            np.column_stack([np.exp(rows["f_log_sim_mem"]), np.ones(len(rows))]) @ self.mem_coef
            if self.mem_coef is not None
            else np.nan
        )
        return out


class PhysicsPredictor(Predictor):
    name = "physics"

    def fit(self, train, val=None):
        return self

    def predict(self, rows):
        out = pd.DataFrame(index=rows.index)
        out["pred_time_s"] = np.exp(rows["f_log_sim_time"])
        out["pred_mem_bytes"] = np.exp(rows["f_log_sim_mem"])
        return out


class GBTPredictor(Predictor):
    name = "gbt"

    @staticmethod
    def _x(df: pd.DataFrame) -> np.ndarray:
        cols = [c for c in df.columns if c.startswith(PLAN_FEATURES_PREFIX) and c not in SIM_FEATURES]
        return df[sorted(cols)].to_numpy(dtype=float)

    def fit(self, train, val=None):
        # lazy: only this baseline needs sklearn, which costs ~1.4 s to import
        from sklearn.ensemble import HistGradientBoostingRegressor

        self.time_model = HistGradientBoostingRegressor(max_iter=400, learning_rate=0.05, random_state=0)
        timed = train[has_time(train)]
        self.time_model.fit(self._x(timed), np.log(timed["iter_time_s"]))
        mem = train[has_memory(train)]
        self.mem_model = None
        if len(mem) >= 20:
            self.mem_model = HistGradientBoostingRegressor(max_iter=400, learning_rate=0.05, random_state=0)
            self.mem_model.fit(self._x(mem), np.log(mem["peak_mem_bytes"].astype(float)))
        return self

    def predict(self, rows):
        out = pd.DataFrame(index=rows.index)
        out["pred_time_s"] = np.exp(self.time_model.predict(self._x(rows)))
        out["pred_mem_bytes"] = np.exp(self.mem_model.predict(self._x(rows))) if self.mem_model else np.nan
        return out


class RuleOfThumbPredictor(Predictor):
    name = "rule_of_thumb"

    def fit(self, train, val=None):
        return self  # nothing to fit: that is the point of it

    def predict(self, rows):
        peak = [_datasheet_peak(h, d) for h, d in zip(rows["fingerprint_id"], rows["dtype"].fillna(ASSUMED_DTYPE))]
        # the parameters a token meets (all of a dense model's; a moe's active ones), from the spec the features
        # were built from (vTrain rows state no vocabulary: the flagged assumption of gnn.dataset.rows)
        flops = 6 * np.exp(rows["f_log_active_params"]) * rows["global_batch_size"] * rows["seq_len"]
        out = pd.DataFrame(index=rows.index)
        out["pred_time_s"] = flops / (rows["world_size"] * np.array(peak, dtype=float) * RULE_OF_THUMB_MFU)
        out["pred_mem_bytes"] = np.nan
        return out


def _datasheet_peak(hardware: str, dtype: str) -> float:
    """A preset's datasheet FLOP/s for the dtype; NaN for a measured fingerprint (it has no datasheet)."""
    try:
        return float(load_hardware(hardware).get("peak_flops_per_s", {}).get(dtype, np.nan))
    except UnknownHardware:
        return np.nan


class MegatronMemoryPredictor(Predictor):
    """Peak memory per GPU in the style of Megatron-LM's theoretical memory report (its
    megatron/training/theoretical_memory_usage.py), fitted to nothing; no time.

    State: the first pipeline stage's parameters on one tp rank (its layers and the embedding), at 18 bytes each
    in mixed precision (bf16 weights 2, fp32 gradients 4, fp32 master weights 4, Adam 8) or 16 in fp32 (no
    master copy), with the optimizer's 12 (mixed) or 8 bytes over dp under a distributed optimizer (zero1) and
    everything over dp under FSDP. Activations: s b h (18 + 4 ffn / h) bytes per layer (its formula, which assumes
    flash attention and selective recompute), over tp, for the pp micro-batches stage 0 holds under 1F1B, i.e.
    the whole model's layers' worth, and over cp.
    """

    name = "megatron_memory"

    def fit(self, train, val=None):
        return self

    def predict(self, rows):
        fp32 = _column(rows, "dtype", ASSUMED_DTYPE).eq("float32")
        cp = _column(rows, "cp", 1)  # rows collected before cp existed have none
        h, layers, tp, data = rows["hidden"], rows["layers"], rows["tp"], rows["dp"] * cp
        embedding = _column(rows, "vocab", np.nan) * h  # rows without a stated vocabulary get no estimate
        tied = _column(rows, "tied_embeddings", False).astype(bool)
        per_layer = (_column(rows, "num_params", np.nan) - embedding * (2 - tied)) / layers
        params = (per_layer * np.ceil(layers / rows["pp"]) + embedding) / tp
        weights_grads = np.where(fp32, 8.0, 6.0)
        optimizer = np.where(fp32, 8.0, 12.0)
        sharding = _column(rows, "sharding", "none")
        state = params * np.select(
            [sharding.eq("zero1"), sharding.str.startswith("fsdp")],
            [weights_grads + optimizer / data, (weights_grads + optimizer) / data],
            weights_grads + optimizer,
        )
        ffn = _column(rows, "ffn_hidden", np.nan).fillna(4 * h)  # GPT: 4h
        tokens = rows["seq_len"] * rows["micro_batch_size"] / cp
        activations = tokens * h * (18 + 4 * ffn / h) * layers / tp * np.where(fp32, 2.0, 1.0)
        out = pd.DataFrame(index=rows.index)
        out["pred_time_s"] = np.nan
        out["pred_mem_bytes"] = state + activations
        return out


def _column(rows: pd.DataFrame, name: str, default) -> pd.Series:
    """A column with its gaps at ``default``; all ``default`` where the rows (older, or of one source) lack it."""
    if name not in rows:
        return pd.Series(default, index=rows.index)
    return rows[name].where(rows[name].notna(), default)
