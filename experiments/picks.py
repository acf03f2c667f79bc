"""Would a user's pick have run, and how fast? The search's choice per (model, nodes), against what was measured.

    python -m experiments.picks [--model models:/plansight@champion] [--max-oom-risk 0.1]

For each held-out H100 split (the largest model, the most GPUs: the playbook's test rules, applied to finished and
failed runs alike, experiments.gpu_fits), its runs are grouped by model and node count, as a planner asks: "the
fastest plan for this model on N nodes". The split's GNN (make evaluate's, never trained on those rows) predicts
every configuration the playbook tried, and picks the fastest it can vouch for, as the search does:

- ``risk``: the fastest whose chance of running out of memory (oom_risk, read from the memory interval) is at most
  --max-oom-risk, the search's rule;
- ``point``: the fastest whose predicted peak fits, the search's rule before (no regard for the interval).

A pick that failed in the playbook (out of memory or crashed) counts as failed; one that ran is scored by its
regret, measured time over the group's fastest measured minus one. Writes experiments/results/picks.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from collect import REPO
from collect.store import ResultStore
from experiments.gpu_fits import RUNS, check_sets, split_model

SPLITS = ("h100/held_out_size", "h100/held_out_scale")
GROUP = ["num_params", "nodes"]


def pick(group: pd.DataFrame, allowed: pd.Series) -> dict:
    """The fastest predicted allowed run of a group, and how it fared."""
    best = group.loc[group["status"] == "ok", "iter_time_s"].min()
    out = {"runs": len(group), "finished": int((group["status"] == "ok").sum()), "best_measured_s": float(best)}
    candidates = group[allowed.loc[group.index]]
    if candidates.empty:
        return out | {"picked": False, "failed": False, "regret": None}
    chosen = candidates.loc[candidates["pred_time_s"].idxmin()]
    ran = chosen["status"] == "ok"
    regret = float(chosen["iter_time_s"] / best - 1) if ran else None
    return out | {"picked": True, "failed": not ran, "regret": regret, "pred_time_s": float(chosen["pred_time_s"])}


def summary(records: list[dict]) -> dict:
    picked = [r for r in records if r["picked"]]
    regrets = [r["regret"] for r in picked if r["regret"] is not None]
    return {
        "groups": len(records),
        "picked": len(picked),
        "failed_picks": sum(r["failed"] for r in picked),
        "median_regret": float(np.median(regrets)) if regrets else None,
        "mean_regret": float(np.mean(regrets)) if regrets else None,
        "within_10pct": float(np.mean([r <= 0.10 for r in regrets])) if regrets else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models:/plansight@champion", help="where a split has no GNN of its own")
    parser.add_argument("--models-dir", default=str(REPO / "build" / "evaluate"))
    parser.add_argument("--max-oom-risk", type=float, default=0.1)
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "picks.json"))
    args = parser.parse_args()

    runs = pd.concat([ResultStore(path).load() for path in RUNS], ignore_index=True)
    runs = runs[runs["status"].isin(["ok", "failed"])].reset_index(drop=True)
    report = {}
    for split, mask in check_sets(runs).items():
        if split not in SPLITS:
            continue
        rows = runs[mask]
        predictor, model = split_model(split, Path(args.models_dir), args.model)
        pred = predictor.predict_rows(rows)
        rows = rows.assign(pred_time_s=pred["iter_time_s"], oom_risk=pred["oom_risk"], fits=pred["fits"])
        policies = {"risk": rows["oom_risk"] <= args.max_oom_risk, "point": rows["fits"].astype(bool)}
        report[split] = {"model": model}
        for name, allowed in policies.items():
            records = [
                {**dict(zip(GROUP, (float(k[0]), int(k[1])))), **pick(group, allowed)}
                for k, group in rows.groupby(GROUP)
                if (group["status"] == "ok").any()
            ]
            report[split][name] = {"summary": summary(records), "groups": records}
            print(f"{split} {name}: {report[split][name]['summary']}")
    Path(args.out).write_text(json.dumps(report, indent=1, default=float) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
