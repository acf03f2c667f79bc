"""Accuracy measures, as the literature reports them.

MAPE; median APE (comparable to the noise floor, itself a median); geometric-mean error
exp(mean |log(pred/true)|) - 1; bias, the geometric mean of pred / true (1 unbiased, 0.5 twice too fast);
p90 and max of the absolute percentage error; oom accuracy, precision and recall; Kendall tau of the plan
ranking within each workload; top-1 success: the predicted-fastest plan of a workload is the measured fastest or
within 10% of it (Lin et al.); regret: how much slower the chosen plan measured than the fastest (mean and median
over workloads).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

WORKLOAD_KEY = ["domain", "layers", "hidden", "heads", "seq_len", "global_batch_size", "world_size"]


def error_stats(pred: np.ndarray, true: np.ndarray) -> dict:
    ok = np.isfinite(pred) & np.isfinite(true) & (true > 0) & (pred > 0)
    pred, true = pred[ok], true[ok]
    if len(true) == 0:
        return {"n": 0, "mape": None, "mdape": None, "gmae": None, "bias": None, "p90": None, "max": None}
    ape = np.abs(pred - true) / true
    return {
        "n": int(len(true)),
        "mape": float(ape.mean()),
        "mdape": float(np.median(ape)),
        "gmae": float(np.exp(np.abs(np.log(pred / true)).mean()) - 1),
        "bias": float(np.exp(np.log(pred / true).mean())),
        "p90": float(np.percentile(ape, 90)),
        "max": float(ape.max()),
    }


def oom_stats(pred_mem: np.ndarray, capacity: np.ndarray, is_oom: np.ndarray) -> dict:
    ok = np.isfinite(pred_mem) & np.isfinite(capacity)
    if not ok.any():
        return {"n": 0, "accuracy": None, "precision": None, "recall": None}
    pred_oom = pred_mem[ok] > capacity[ok]
    truth = is_oom[ok].astype(bool)
    tp = int((pred_oom & truth).sum())
    return {
        "n": int(ok.sum()),
        "accuracy": float((pred_oom == truth).mean()),
        "precision": tp / int(pred_oom.sum()) if pred_oom.any() else None,
        "recall": tp / int(truth.sum()) if truth.any() else None,
    }


def ranking_stats(rows: pd.DataFrame, pred_time: pd.Series) -> dict:
    taus, hits, regrets = [], [], []
    df = rows.assign(pred=pred_time)
    for _, group in df.groupby(WORKLOAD_KEY, dropna=False):
        plans = group.groupby("run_id").agg(true=("iter_time_s", "median"), pred=("pred", "median"))
        # a predictor may not say (the rule of thumb on a CPU), and a fake trace has no time to rank by
        plans = plans[np.isfinite(plans["pred"]) & np.isfinite(plans["true"])]
        if len(plans) < 2:
            continue
        if len(plans) >= 3:
            tau = kendalltau(plans["pred"], plans["true"]).statistic
            if np.isfinite(tau):
                taus.append(tau)
        chosen = plans["pred"].idxmin()
        hits.append(plans.loc[chosen, "true"] <= 1.10 * plans["true"].min())
        regrets.append(plans.loc[chosen, "true"] / plans["true"].min() - 1)
    return {
        "n_workloads": len(hits),
        "kendall_tau": float(np.mean(taus)) if taus else None,
        "top1_success": float(np.mean(hits)) if hits else None,
        "regret": float(np.mean(regrets)) if regrets else None,
        "median_regret": float(np.median(regrets)) if regrets else None,
    }
