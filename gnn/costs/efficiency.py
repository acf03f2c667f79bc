"""The analytical time model's fit: iteration time as non-negative efficiencies times physical terms.

Shared by the analytical baseline (gnn.predictors.baselines) and the network's
physics base (gnn.model.physics_base): five terms from the simulator's compute
and communication sums and the pipeline's shape, and two for a framework's
latency per layer (plan.tp_layer_latency), each weighted by a coefficient >= 0
fitted on relative error.

The latency terms count layer passes per rank times tp - 1 (growing as a ring's
steps over the tensor-parallel group would; the mechanism is not known), once in
all and once more under pipeline parallelism. Fitted to h100/held_out_size's training rows (the playbook's 1.3B
and 3.6B Nanotron runs, and NVIDIA's runs, which do not set the convention),
they take 0.4 ms and 2.8 ms per step: the plateau both sizes show. The terms are
zero on plans without the convention, which so leave their coefficients alone.
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
    """[rows, 8]: compute (priced from the datasheet, and from a measured kernel table: each its own
    efficiency), communication, pipeline bubble, per-layer launches per rank, constant, and the framework's
    latency per layer (plan.tp_layer_latency): in all, and under pipeline parallelism."""
    compute = np.exp(df["f_log_sim_compute"])  # sum of FLOP-derived compute times on the busiest rank
    table = df["f_kernel_table"].to_numpy() if "f_kernel_table" in df else np.zeros(len(df))
    comm = np.exp(df["f_log_sim_comm"])  # sum of collective times from the cost curves
    bubble = (
        compute * (2 ** df["f_log2_pp"] - 1) / (2 ** df["f_log2_num_microbatches"] * 2 ** df["f_log2_virtual_stages"])
    )
    ops = df["layers"] * 2 ** df["f_log2_num_microbatches"] / 2 ** df["f_log2_pp"]  # per-layer launches per rank
    latency = ops * (2 ** df["f_log2_tp"] - 1) * df["f_tp_layer_latency"]
    pipelined = latency * (df["f_log2_pp"] > 0)
    measured = compute * table
    return np.column_stack([compute - measured, measured, comm, bubble, ops, np.ones(len(df)), latency, pipelined])
