"""The analytical time model's fit: iteration time as non-negative efficiencies times physical terms.

Shared by the analytical baseline (gnn.predictors.baselines) and the network's
physics base (gnn.model.physics_base): five terms from the simulator's compute
and communication sums and the pipeline's shape, each weighted by a coefficient
>= 0 fitted on relative error.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def relative_nnls(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Coefficients >= 0 minimising the squared *relative* error sum((Xc - y) / y)^2."""
    from scipy.optimize import nnls  # lazy: predictions import this module, only fits need it (~0.5 s)

    coef, _ = nnls(design / target[:, None], np.ones_like(target))
    return coef


def time_terms(df: pd.DataFrame) -> np.ndarray:
    """[rows, 5]: compute, communication, pipeline bubble, per-layer launches per rank, constant."""
    compute = np.exp(df["f_log_sim_compute"])  # sum of FLOP-derived compute times on the busiest rank
    comm = np.exp(df["f_log_sim_comm"])  # sum of collective times from the cost curves
    bubble = (
        compute * (2 ** df["f_log2_pp"] - 1) / (2 ** df["f_log2_num_microbatches"] * 2 ** df["f_log2_virtual_stages"])
    )
    ops = df["layers"] * 2 ** df["f_log2_num_microbatches"] / 2 ** df["f_log2_pp"]  # per-layer launches per rank
    return np.column_stack([compute, comm, bubble, ops, np.ones(len(df))])
