"""An ensemble of surrogates with conformally calibrated prediction intervals.

Members differ only in their seed (initialisation and batch order). The point
prediction is the members' mean in log space; the spread is their standard
deviation. Spread alone is not a calibrated interval (members trained on the
same rows agree more than the data warrants), so a split-conformal factor is
fitted on the validation rows: the interval mean +- k * (spread + floor)
holds the measured value on ``coverage`` of validation rows. How often it
holds on the test rows is the calibration we report.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch_geometric.loader import DataLoader

COVERAGE = 0.8
SPREAD_FLOOR = 0.01  # log units: members that agree exactly still leave ~1% of doubt


class Ensemble(nn.Module):
    def __init__(self, members: list[nn.Module], coverage: float = COVERAGE):
        super().__init__()
        self.members = nn.ModuleList(members)
        self.coverage = coverage
        self.register_buffer("k", torch.ones(2))  # conformal factor for log time, log memory

    @torch.no_grad()
    def raw(self, graphs, batch_size: int = 1024) -> np.ndarray:
        """[members, n, 3]: every member's log time, log memory and oom logit."""
        outs = [torch.stack([m(batch) for m in self.members]) for batch in DataLoader(graphs, batch_size=batch_size)]
        return torch.cat(outs, dim=1).numpy() if outs else np.zeros((len(self.members), 0, 3))

    @staticmethod
    def summarize(raw: np.ndarray) -> dict[str, np.ndarray]:
        mean, spread = raw.mean(0), raw.std(0) + SPREAD_FLOOR
        return {"log_time": mean[:, 0], "log_mem": mean[:, 1], "time_spread": spread[:, 0],
                "mem_spread": spread[:, 1], "oom_prob": 1 / (1 + np.exp(-mean[:, 2]))}

    def predict(self, graphs, batch_size: int = 1024) -> dict[str, np.ndarray]:
        """Point predictions and interval bounds (seconds, bytes), in graph order."""
        s = self.summarize(self.raw(graphs, batch_size))
        k_time, k_mem = self.k.tolist()
        return {"iter_time_s": np.exp(s["log_time"]),
                "iter_time_lo_s": np.exp(s["log_time"] - k_time * s["time_spread"]),
                "iter_time_hi_s": np.exp(s["log_time"] + k_time * s["time_spread"]),
                "peak_mem_bytes": np.exp(s["log_mem"]),
                "peak_mem_lo_bytes": np.exp(s["log_mem"] - k_mem * s["mem_spread"]),
                "peak_mem_hi_bytes": np.exp(s["log_mem"] + k_mem * s["mem_spread"]),
                "oom_prob": s["oom_prob"]}

    def calibrate(self, graphs, log_time: np.ndarray, log_mem: np.ndarray) -> None:
        """Fit k on held-out (validation) graphs with their measured log targets."""
        s = self.summarize(self.raw(graphs))
        k = []
        for pred, spread, truth in ((s["log_time"], s["time_spread"], log_time), (s["log_mem"], s["mem_spread"], log_mem)):
            score = np.abs(truth - pred) / spread
            score = score[np.isfinite(score)]
            k.append(conformal_quantile(score, self.coverage) if len(score) else 1.0)
        self.k.copy_(torch.tensor(k, dtype=torch.float32))


def conformal_quantile(scores: np.ndarray, coverage: float) -> float:
    """The finite-sample split-conformal quantile: ceil((n+1) q) / n."""
    n = len(scores)
    level = min(1.0, np.ceil((n + 1) * coverage) / n)
    return float(np.quantile(scores, level, method="higher"))


def interval_coverage(lo: np.ndarray, hi: np.ndarray, truth: np.ndarray) -> float | None:
    ok = np.isfinite(truth)
    return float(((truth[ok] >= lo[ok]) & (truth[ok] <= hi[ok])).mean()) if ok.any() else None
