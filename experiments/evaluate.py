"""Evaluate every predictor on every named split; print the table, write the records.

    python -m experiments.evaluate [--out experiments/results/evaluation.json]   (make evaluate)

Each predictor is fit on a split's training rows (train + val: the baselines
have no hyper-parameters to select) and scored on its test rows, separately for
the CPU runs and the A100 (vTrain) rows. Records: {predictor, domain, split,
target (time | memory), n, mape, gmae, p90, max}, plus oom and ranking
records, plus the measured noise floor of each CPU split's test rows.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from collect.report import noise_floor
from gnn.baselines import REGISTRY
from gnn.dataset import PlanGraphs
from gnn.metrics import error_stats, oom_stats, ranking_stats
from gnn.splits import named_splits


def evaluate_predictor(name: str, meta: pd.DataFrame, split: str, parts: dict) -> list[dict]:
    domain, split_name = split.split("/", 1)
    train = meta.loc[np.concatenate([parts["train"], parts["val"]])]
    test = meta.loc[parts["test"]]
    pred = REGISTRY[name]().fit(train).predict(test)
    base = {"predictor": name, "domain": domain, "split": split_name}
    records = [{**base, "target": "time", **error_stats(pred["pred_time_s"].to_numpy(), test["iter_time_s"].to_numpy())}]
    if test["peak_mem_bytes"].notna().any():
        records.append({**base, "target": "memory",
                        **error_stats(pred["pred_mem_bytes"].to_numpy(dtype=float), test["peak_mem_bytes"].to_numpy(dtype=float))})
        records.append({**base, "target": "oom", **oom_stats(pred["pred_mem_bytes"].to_numpy(dtype=float),
                                                             test["memory_bytes"].to_numpy(dtype=float),
                                                             (test["status"] == "oom").to_numpy())})
    records.append({**base, "target": "ranking", **ranking_stats(test, pred["pred_time_s"])})
    return records


def noise_records(meta: pd.DataFrame, splits: dict) -> list[dict]:
    records = []
    for split, parts in splits.items():
        domain, name = split.split("/", 1)
        test = meta.loc[parts["test"]]
        if domain != "cpu" or test["repeat_group"].isna().all():
            continue
        floor = noise_floor(test).iloc[0]
        records.append({"predictor": "noise_floor", "domain": domain, "split": name, "target": "time",
                        "n": int(floor["measurements"]), "mape": float(floor["median_rel_dev"]),
                        "mean_rel_dev": float(floor["mean_rel_dev"])})
    return records


def table(records: list[dict]) -> str:
    df = pd.DataFrame(records)
    errors = df[df.target.isin(["time", "memory"])].pivot_table(index=["domain", "split", "target"], columns="predictor",
                                                                values="mape", aggfunc="first")
    lines = ["MAPE by split (test rows); noise_floor = median relative deviation of repeated measurements",
             (errors * 100).round(2).to_string()]
    extra = df[df.target.isin(["oom", "ranking"])]
    if len(extra):
        cols = [c for c in ("accuracy", "recall", "kendall_tau", "top1_success") if c in extra]
        lines += ["", "oom accuracy / recall and plan ranking (test rows)",
                  extra.pivot_table(index=["domain", "split", "target"], columns="predictor", values=cols,
                                    aggfunc="first").round(3).to_string()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="experiments/results/evaluation.json")
    parser.add_argument("--predictors", nargs="*", default=list(REGISTRY))
    args = parser.parse_args()
    meta = PlanGraphs().meta
    splits = named_splits(meta)
    records = noise_records(meta, splits)
    for split, parts in splits.items():
        for name in args.predictors:
            records += evaluate_predictor(name, meta, split, parts)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(records, indent=1))
    print(table(records))
    print(f"\nwrote {len(records)} records to {args.out}")


if __name__ == "__main__":
    main()
