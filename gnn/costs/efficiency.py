"""The analytical time model's fit: iteration time as non-negative efficiencies times physical terms.

Shared by the analytical baseline (gnn.predictors.baselines) and the network's
physics base (gnn.model.physics_base): five terms from the simulator's compute
and communication sums and the pipeline's shape, a constant, and three for a
latency per layer under tensor parallelism, each weighted by a coefficient >= 0
fitted on relative error.

The latency terms count layer passes per rank times tp - 1 (growing as a ring's
steps over the tensor-parallel group would; the mechanism is not known). Two are
paid wherever the tensor-parallel collectives sit in the layer's critical path
(every framework that does not overlap them with its GEMMs, plan.tp_comm_overlap):
in all, and once more under pipeline parallelism. Two sources show it: vTrain's
Megatron runs on A100s (2.5-3.5 ms per layer pass over the simulator at every tp)
and the Playbook's Nanotron runs on H100s. The third is Nanotron's own
(plan.tp_layer_latency), paid under pipeline parallelism, where its runs wait
several times longer than any other framework's. A fit without a framework's
runs keeps the first two, so a framework never seen still pays a latency.
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
    """[rows, TERMS]: compute (priced from the datasheet, and from a measured kernel table: each its own
    efficiency), communication, pipeline bubble, per-layer launches per rank, constant, and the latency per layer of
    exposed tensor-parallel collectives (in all, and under pipeline parallelism) and of Nanotron's convention (under
    pipeline parallelism)."""
    compute = np.exp(df["f_log_sim_compute"])  # sum of FLOP-derived compute times on the busiest rank
    table = df["f_kernel_table"].to_numpy() if "f_kernel_table" in df else np.zeros(len(df))
    comm = np.exp(df["f_log_sim_comm"])  # sum of collective times from the cost curves
    bubble = (
        compute * (2 ** df["f_log2_pp"] - 1) / (2 ** df["f_log2_num_microbatches"] * 2 ** df["f_log2_virtual_stages"])
    )
    ops = df["layers"] * 2 ** df["f_log2_num_microbatches"] / 2 ** df["f_log2_pp"]  # per-layer launches per rank
    ring = ops * (2 ** df["f_log2_tp"] - 1)
    pipelined = df["f_log2_pp"] > 0
    exposed = ring * df["f_tp_exposed"]
    measured = compute * table
    return np.column_stack(
        [compute - measured, measured, comm, bubble, ops, np.ones(len(df)), exposed, exposed * pipelined,
         ring * df["f_tp_layer_latency"] * pipelined]
    )  # fmt: skip


TERMS = 9  # time_terms' columns
