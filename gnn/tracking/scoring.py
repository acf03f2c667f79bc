"""Score predictions against measured rows: the records `make evaluate` and MLflow share.

One record per (target): time and memory error statistics (with the 80%
interval's coverage where the predictor gives one), oom classification from
predicted memory against capacity, and plan ranking within workloads.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from gnn.dataset.splits import calibration_domain, scored_domain
from gnn.model.intervals.conformal import interval_coverage
from gnn.predictors.metrics import error_stats, oom_stats, ranking_stats


def score(rows: pd.DataFrame, pred: pd.DataFrame, base: dict) -> list[dict]:
    """``pred`` is indexed like ``rows`` with pred_time_s, pred_mem_bytes and optional *_lo / *_hi columns."""
    true_time = rows["iter_time_s"].to_numpy(dtype=float)
    time = {**base, "target": "time", **error_stats(pred["pred_time_s"].to_numpy(dtype=float), true_time)}
    if "pred_time_lo_s" in pred:
        time["coverage"] = interval_coverage(
            pred["pred_time_lo_s"].to_numpy(), pred["pred_time_hi_s"].to_numpy(), true_time
        )
    records = [time]
    true_mem = rows["peak_mem_bytes"].to_numpy(dtype=float)
    if np.isfinite(true_mem).any():
        pred_mem = pred["pred_mem_bytes"].to_numpy(dtype=float)
        memory = {**base, "target": "memory", **error_stats(pred_mem, true_mem)}
        if "pred_mem_lo_bytes" in pred:
            memory["coverage"] = interval_coverage(
                pred["pred_mem_lo_bytes"].to_numpy(), pred["pred_mem_hi_bytes"].to_numpy(), true_mem
            )
        records += [
            memory,
            {
                **base,
                "target": "oom",
                **oom_stats(pred_mem, rows["memory_bytes"].to_numpy(dtype=float), (rows["status"] == "oom").to_numpy()),
            },
        ]
    records.append({**base, "target": "ranking", **ranking_stats(rows, pred["pred_time_s"])})
    return records


def ensemble_frame(pred: dict, index) -> pd.DataFrame:
    """An Ensemble.predict result in the column names score() reads."""
    return pd.DataFrame(
        {
            "pred_time_s": pred["iter_time_s"],
            "pred_time_lo_s": pred["iter_time_lo_s"],
            "pred_time_hi_s": pred["iter_time_hi_s"],
            "pred_mem_bytes": pred["peak_mem_bytes"],
            "pred_mem_lo_bytes": pred["peak_mem_lo_bytes"],
            "pred_mem_hi_bytes": pred["peak_mem_hi_bytes"],
            "oom_prob": pred["oom_prob"],
        },
        index=index,
    )


def ensemble_records(
    ensemble, ds, parts: dict, split: str, predictor: str = "gnn", which: tuple[str, ...] = ("val", "test")
) -> tuple[list[dict], dict]:
    """Score records of the ensemble on parts of a split, per hardware domain; and the frames behind them."""
    records, frames = [], {}
    for part in which:
        idx = parts[part]
        rows = ds.meta.loc[idx]
        graphs = ds[torch.as_tensor(idx)]
        calibrated_as = calibration_domain(rows).tolist()
        pred = ensemble.predict(graphs, domains=rows["domain"].astype(str).tolist(), calibrated_as=calibrated_as)
        pred = ensemble_frame(pred, rows.index)
        frames[part] = (rows, pred)
        prefix, name = split.split("/", 1)
        for domain, group in rows.groupby(scored_domain(rows)):
            records += score(
                group, pred.loc[group.index], {"predictor": predictor, "domain": domain, "split": name, "part": part}
            )
        if part == "test" and prefix not in set(scored_domain(rows)) and prefix != "all":
            # a split over several GPUs (a held-out model or precision): scored whole too, like its baselines
            records += score(rows, pred, {"predictor": predictor, "domain": prefix, "split": name, "part": part})
    return records, frames


def metrics_of(records: list[dict]) -> dict[str, float]:
    out = {}
    for r in records:
        for key in ("mape", "mdape", "p90", "coverage", "accuracy", "kendall_tau", "top1_success"):
            if r.get(key) is not None:
                out[f"{r['part']}_{r['domain']}_{r['target']}_{key}"] = r[key]
    return out


def selection_value(records: list[dict], part: str = "val") -> float:
    """The champion metric: mean over domains of time MAPE + memory MAPE on ``part``."""
    values = {}
    for r in records:
        if r["part"] == part and r["target"] in ("time", "memory") and r.get("mape") is not None:
            values.setdefault(r["domain"], 0.0)
            values[r["domain"]] += r["mape"]
    return sum(values.values()) / len(values)
