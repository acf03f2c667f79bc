"""Baselines behind one predictor interface, registered by name.

Every predictor is fit on a split's training rows of one hardware domain and
predicts iteration time and peak memory for any rows (vidur's pattern: one
interface, subclasses provide only their estimator).

- analytical: transformer formulas (FLOPs, collective volumes, activation and
  state bytes) combined with efficiencies fitted by non-negative least squares
  on relative error.
- simulator: the critical-path simulator over the execution graph, with one
  fitted scale for time and a scale plus offset for memory.
- gbt: gradient-boosted trees on flat plan, workload and hardware features.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

PLAN_FEATURES_PREFIX = "f_"
SIM_COLUMNS = ("f_log_sim_time", "f_log_sim_mem", "f_log_sim_compute", "f_log_sim_comm", "f_log_sim_exposed",
               "f_log_analytic_mem")  # model outputs, not plan features: kept from the tabular baseline


class Predictor:
    name = "base"

    def fit(self, train: pd.DataFrame) -> "Predictor":
        raise NotImplementedError

    def predict(self, rows: pd.DataFrame) -> pd.DataFrame:
        """DataFrame with pred_time_s and pred_mem_bytes (NaN where the predictor cannot say)."""
        raise NotImplementedError


def _relative_nnls(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Coefficients >= 0 minimising the squared *relative* error sum((Xc - y) / y)^2."""
    from scipy.optimize import nnls  # here: predictions import this module, fits alone need scipy.optimize

    coef, _ = nnls(design / target[:, None], np.ones_like(target))
    return coef


def _has_memory(df: pd.DataFrame) -> pd.Series:
    return df["peak_mem_bytes"].notna() & (df["peak_mem_bytes"] > 0)


class AnalyticalPredictor(Predictor):
    name = "analytical"

    @staticmethod
    def _time_terms(df: pd.DataFrame) -> np.ndarray:
        compute = np.exp(df["f_log_sim_compute"])  # sum of FLOP-derived compute times on the busiest rank
        comm = np.exp(df["f_log_sim_comm"])  # sum of collective times from the cost curves
        bubble = compute * (2 ** df["f_log2_pp"] - 1) / (2 ** df["f_log2_num_microbatches"] * 2 ** df["f_log2_virtual_stages"])
        ops = df["layers"] * 2 ** df["f_log2_num_microbatches"] / 2 ** df["f_log2_pp"]  # per-layer launches per rank
        return np.column_stack([compute, comm, bubble, ops, np.ones(len(df))])

    def fit(self, train):
        self.time_coef = _relative_nnls(self._time_terms(train), train["iter_time_s"].to_numpy())
        mem = train[_has_memory(train)]
        self.mem_coef = None
        if len(mem) >= 5:
            self.mem_coef = _relative_nnls(self._mem_terms(mem), mem["peak_mem_bytes"].to_numpy(dtype=float))
        return self

    @staticmethod
    def _mem_terms(df: pd.DataFrame) -> np.ndarray:
        # closed-form parameter, gradient, optimizer and activation accounting (gnn.costs)
        return np.column_stack([np.exp(df["f_log_analytic_mem"]), np.ones(len(df))])

    def predict(self, rows):
        out = pd.DataFrame(index=rows.index)
        out["pred_time_s"] = self._time_terms(rows) @ self.time_coef
        out["pred_mem_bytes"] = self._mem_terms(rows) @ self.mem_coef if self.mem_coef is not None else np.nan
        return out


class SimulatorPredictor(Predictor):
    name = "simulator"

    def fit(self, train):
        ratio = np.log(train["iter_time_s"]) - train["f_log_sim_time"]
        self.time_scale = float(np.exp(np.median(ratio)))
        mem = train[_has_memory(train)]
        self.mem_coef = None
        if len(mem) >= 5:
            design = np.column_stack([np.exp(mem["f_log_sim_mem"]), np.ones(len(mem))])
            self.mem_coef = _relative_nnls(design, mem["peak_mem_bytes"].to_numpy(dtype=float))
        return self

    def predict(self, rows):
        out = pd.DataFrame(index=rows.index)
        out["pred_time_s"] = self.time_scale * np.exp(rows["f_log_sim_time"])
        out["pred_mem_bytes"] = (np.column_stack([np.exp(rows["f_log_sim_mem"]), np.ones(len(rows))]) @ self.mem_coef
                                 if self.mem_coef is not None else np.nan)
        return out


class GBTPredictor(Predictor):
    name = "gbt"

    @staticmethod
    def _x(df: pd.DataFrame) -> np.ndarray:
        cols = [c for c in df.columns if c.startswith(PLAN_FEATURES_PREFIX) and c not in SIM_COLUMNS]
        return df[sorted(cols)].to_numpy(dtype=float)

    def fit(self, train):
        # here, not at the top: every prediction imports this module (gnn.physics_base), and sklearn costs ~1.4 s
        from sklearn.ensemble import HistGradientBoostingRegressor

        self.time_model = HistGradientBoostingRegressor(max_iter=400, learning_rate=0.05, random_state=0)
        self.time_model.fit(self._x(train), np.log(train["iter_time_s"]))
        mem = train[_has_memory(train)]
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


REGISTRY: dict[str, type[Predictor]] = {cls.name: cls for cls in (AnalyticalPredictor, SimulatorPredictor, GBTPredictor)}
