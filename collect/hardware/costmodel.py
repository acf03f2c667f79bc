"""Lin et al.'s three-region latency model of a collective ("Towards Universal Performance Modeling for ML
Training on Multi-GPU Platforms", section IV-A).

    t(m) = t_s                                  m <= m1   (constant latency)
         = log2(m) / 10**sigmoid(log2 m)        m1 < m < m2 (S-shaped transition)
         = t_s + m / bw_max                     m >= m2   (bandwidth-bound)
    sigmoid(x) = L / (1 + exp(-k (x - x0))) + b

Eight parameters per (op, group size). Fitting picks the region boundaries
among the measured sizes that minimise squared log error.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class ThreeRegionCurve:
    t_s: float
    m1: float
    m2: float
    bw_max: float
    L: float
    x0: float
    k: float
    b: float

    def predict(self, m: float | np.ndarray) -> np.ndarray:
        m = np.maximum(np.asarray(m, dtype=float), 1.0)
        x = np.log2(m)
        with np.errstate(over="ignore"):  # 10**large -> inf -> 0 s, only outside the region used
            transition = x / 10 ** _sigmoid(x, self.L, self.x0, self.k, self.b)
        t = np.where(m <= self.m1, self.t_s, transition)
        return np.where(m >= self.m2, self.t_s + m / self.bw_max, t)

    def to_dict(self) -> dict:
        return asdict(self)


def _sigmoid(x, L, x0, k, b):
    return L / (1.0 + np.exp(-np.clip(k * (x - x0), -50, 50))) + b


def fit_three_region(sizes, times) -> ThreeRegionCurve:
    m = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    order = np.argsort(m)
    m, t = m[order], t[order]
    if len(m) < 3:
        raise ValueError(f"need at least 3 message sizes to fit a three-region curve, got {len(m)}")
    best, best_err = None, math.inf
    for i in range(0, len(m) - 1):
        for j in range(i + 1, len(m)):
            curve = _fit_with_boundaries(m, t, i, j)
            err = float(np.sum(np.log(curve.predict(m) / t) ** 2))
            if err < best_err:
                best, best_err = curve, err
    return best


def _fit_with_boundaries(m: np.ndarray, t: np.ndarray, i: int, j: int) -> ThreeRegionCurve:
    """Regions: sizes[:i+1] latency-bound, sizes[j:] bandwidth-bound, between is the transition."""
    # lazy: every prediction imports this module, and scipy.optimize costs ~0.5 s of a command's start
    from scipy.optimize import OptimizeWarning, curve_fit

    t_s = float(np.median(t[: i + 1]))
    tail_m, tail_t = m[j:], t[j:]
    excess = np.maximum(tail_t - t_s, 1e-12)
    bw_max = float(np.sum(tail_m**2) / np.sum(tail_m * excess))  # least squares of excess = m / bw
    x = np.log2(m[i : j + 1])
    y = np.log10(np.maximum(x, 1e-9) / t[i : j + 1])  # sigmoid(x) = log10(log2(m) / t)
    params = (0.0, float(x.mean()), 1.0, float(y.mean()))
    if len(x) >= 4:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OptimizeWarning)  # covariance is not used
                params, _ = curve_fit(
                    _sigmoid, x, y, p0=(float(np.ptp(y)) or 1.0, float(x.mean()), 1.0, float(y.min())), maxfev=5000
                )
        except (RuntimeError, ValueError):
            pass  # keep the flat sigmoid: the transition is then a single latency level
    return ThreeRegionCurve(t_s, float(m[i]), float(m[j]), bw_max, *map(float, params))
