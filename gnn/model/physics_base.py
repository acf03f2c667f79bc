"""The fitted analytical time model as a torch module: the base the network corrects.

The raw simulator is a poor base for iteration time on some hardware (48% MAPE
on the A100 rows, worse on unseen widths), because its absolute costs assume
datasheet peak throughput. The analytical model (gnn.costs.efficiency) fits
non-negative efficiencies (compute, communication, pipeline bubble, per-layer
launch overhead, constant, tensor parallelism's latency per layer) to the training rows and generalises to
unseen shapes at 11-16%. Fitted per hardware domain on the training rows only, it
gives the network a calibrated starting point, so the network learns what
even the fitted physics misses.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import nn

from gnn.costs.efficiency import TERMS, relative_nnls, time_terms

COLUMNS = (
    "f_log_sim_compute",
    "f_log_sim_comm",
    "f_log2_pp",
    "f_log2_num_microbatches",
    "f_log2_virtual_stages",
    "f_log_layers",
    "f_cuda",
    "f_log2_tp",
    "f_tp_layer_latency",
    "f_kernel_table",
    "f_tp_exposed",
)


class AnalyticalTimeBase(nn.Module):
    def __init__(self, feature_names: list[str]):
        super().__init__()
        self.index = [feature_names.index(c) for c in COLUMNS]
        self.register_buffer("coef", torch.zeros(2, TERMS, dtype=torch.float64))  # [domain CPU / CUDA, term]

    def fit(self, train: pd.DataFrame) -> None:
        for domain in (0, 1):
            rows = train[((train["f_cuda"] > 0.5) == bool(domain)) & train["iter_time_s"].notna()]
            if len(rows) >= 5:
                coef = relative_nnls(time_terms(rows), rows["iter_time_s"].to_numpy())
                self.coef[domain] = torch.from_numpy(np.asarray(coef, dtype=np.float64))
        empty = self.coef.abs().sum(1) == 0
        self.coef[empty] = self.coef[~empty].mean(0) if (~empty).any() else 0.0

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """Log of the fitted analytical iteration time, per graph."""
        c = u[:, self.index].double()
        compute, comm = torch.exp(c[:, 0]), torch.exp(c[:, 1])
        pp, nmb, v = 2 ** c[:, 2], 2 ** c[:, 3], 2 ** c[:, 4]
        layers, tp, nanotron, exposed_flag = torch.exp(c[:, 5]), 2 ** c[:, 7], c[:, 8], c[:, 10]
        ops = layers * nmb / pp
        ring, pipelined = ops * (tp - 1), pp > 1
        measured = compute * c[:, 9]
        bubble = compute * (pp - 1) / (nmb * v)
        ones = torch.ones_like(compute)
        exposed = ring * exposed_flag
        terms = [compute - measured, measured, comm, bubble, ops, ones, exposed, exposed * pipelined]
        terms = torch.stack([*terms, ring * nanotron * pipelined], 1)
        coef = self.coef[(c[:, 6] > 0.5).long()]
        return torch.log((terms * coef).sum(1).clamp_min(1e-9)).float()


TIME_BASES = ("analytical", "simulator")  # what a time head may correct (time_base_for)


def time_base_for(sim_index: tuple[int, int] | None, time_base: str, feature_names: list[str] | None):
    """What a network's time head corrects: the fitted analytical model, or None for the raw simulator's time
    (``time_base="simulator"``) or no physics at all (``sim_index`` None)."""
    return AnalyticalTimeBase(feature_names) if sim_index is not None and time_base == "analytical" else None


def offset_from_physics(u: torch.Tensor, sim_index: tuple[int, int] | None, base: AnalyticalTimeBase | None):
    """[n_graphs, 3] added to a network's heads: the log time and log memory it corrects (0 without physics)."""
    if sim_index is None:
        return torch.zeros(u.shape[0], 3, dtype=u.dtype, device=u.device)
    time = base(u) if base is not None else u[:, sim_index[0]]
    return torch.stack([time, u[:, sim_index[1]], torch.zeros_like(time)], 1)
