"""The one interface every predictor has: fit on a split's training rows, predict time and memory for any rows.

vidur's pattern: subclasses provide only their estimator, and each is registered
by name (gnn.predictors.registry). Rows are the graph dataset's meta frame
(gnn.dataset.graphs): a measured row's plan, workload and hardware, its flat
features (``f_*``) and the simulator's outputs.
"""

from __future__ import annotations

import pandas as pd

PLAN_FEATURES_PREFIX = "f_"
SIM_FEATURES = (
    "f_log_sim_time",
    "f_log_sim_mem",
    "f_log_sim_compute",
    "f_log_sim_comm",
    "f_log_sim_exposed",
    "f_log_analytic_mem",
)  # the simulator's outputs among the plan features (f_*), in log units: kept from the tabular baseline


class Predictor:
    name = "base"

    def fit(self, train: pd.DataFrame, val: pd.DataFrame | None = None) -> "Predictor":
        """``val``: rows for early stopping and calibration, for predictors that use them."""
        raise NotImplementedError

    def predict(self, rows: pd.DataFrame) -> pd.DataFrame:
        """DataFrame with pred_time_s and pred_mem_bytes (NaN where the predictor cannot say)."""
        raise NotImplementedError
