"""Does a source's slowdown with scale carry beyond the largest scale trained on, as a trend or as a constant?

    python -m experiments.sources.scale_trend

Nested checks, per GPU source and for each of its three largest world sizes N: the fitted analytical time model
(gnn.model.physics_base, the base the network corrects; gnn.predictors.nested checks with the same terms) is
fitted on every other source's timed runs and this source's runs of at most N/2 GPUs, and each of the source's
runs gets its residual log(measured / base). The correction at the edge is the median residual at the largest
world size fitted on; the trend is a line through the median residuals of the top TREND_LEVELS world sizes fitted
on, in log2 GPUs. Each predicts the runs at N (constant: the edge; trend: the edge plus the slope times the
doublings to N), scored by the median |log error| of those runs. The trend carries on a source where it beats the
constant on the checks that could be made. Writes experiments/results/scale_trend.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import warnings

import numpy as np
import pandas as pd
import torch

from collect import REPO

OUT = REPO / "experiments" / "results" / "scale_trend.json"
TREND_LEVELS = 3  # world sizes at the top of what was fitted on that the slope is fitted through
MIN_RUNS = 5  # runs a world size needs to count as a level, and the held-out size to be scored
CHECKS = 3  # the source's largest world sizes each held out in turn


def check(runs: pd.DataFrame, level: int) -> dict | None:
    """One nested check of a source: ``runs`` [level (log2 GPUs), r (residual against a base fitted without the
    source's runs at ``level`` and beyond)]; None where fewer than two levels below, or too few runs at ``level``."""
    below = runs[runs["level"] < level].groupby("level")["r"].agg(["median", "size"])
    below = below[below["size"] >= MIN_RUNS].tail(TREND_LEVELS)
    held = runs.loc[runs["level"] == level, "r"].to_numpy()
    if len(below) < 2 or len(held) < MIN_RUNS:
        return None
    slope = float(np.polyfit(below.index.to_numpy(float), below["median"].to_numpy(), 1)[0])
    edge, gap = float(below["median"].iloc[-1]), float(level - below.index[-1])
    return {
        "gpus": 2 ** int(level),
        "runs": int(len(held)),
        "edge": edge,
        "truth": float(np.median(held)),
        "slope": slope,
        "error_constant": float(np.median(np.abs(held - edge))),
        "error_trend": float(np.median(np.abs(held - edge - slope * gap))),
    }


def verdict(checks: list[dict]) -> str:
    """ "trend" where the trend's error summed over a source's checks is below the constant's, else "constant"."""
    trend, constant = (sum(c[f"error_{k}"] for c in checks) for k in ("trend", "constant"))
    return "trend" if trend < constant else "constant"


def residuals(timed: pd.DataFrame, source: str, level: int, features: list[str]) -> pd.DataFrame:
    """The source's runs with their residual against the base fitted without its runs at ``level`` and beyond."""
    from gnn.model.physics_base import AnalyticalTimeBase  # lazy: the dataset's code is only needed to run this

    own = timed["source"] == source
    base = AnalyticalTimeBase(features)
    base.fit(timed[~own | (timed["level"] < level)])
    runs = timed[own]
    fitted = base(torch.tensor(runs[features].to_numpy(dtype=np.float64))).numpy()
    return runs.assign(r=np.log(runs["iter_time_s"].to_numpy()) - fitted)[["level", "r"]]


def run() -> dict:
    from gnn.dataset.graphs import PlanGraphs  # lazy: building the graphs takes a minute
    from gnn.dataset.splits import source_of  # lazy: as above

    meta = PlanGraphs().meta
    features = [c for c in meta.columns if c.startswith("f_")]
    timed = meta[meta["iter_time_s"].notna() & (meta["f_cuda"] > 0.5) & (meta["status"] == "ok")]
    timed = timed.assign(source=source_of(timed), level=np.round(np.log2(timed["world_size"])).astype(int))
    report = {}
    for source in sorted(timed["source"].unique()):
        levels = sorted(timed.loc[timed["source"] == source, "level"].unique())
        checks = []
        for level in levels[-CHECKS:]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the base's solver warns on sparse device classes
                found = check(residuals(timed, source, level, features), level)
            if found:
                checks.append(found)
        if checks:
            report[source] = {"checks": checks, "carries": verdict(checks)}
    return report


def table(report: dict) -> str:
    lines = [f"{'source':<16}{'GPUs':>6}{'runs':>6}{'edge':>7}{'truth':>7}{'slope':>7}{'constant':>10}{'trend':>7}"]
    for source, entry in report.items():
        for c in entry["checks"]:
            lines.append(
                f"{source:<16}{c['gpus']:>6}{c['runs']:>6}{c['edge']:>7.2f}{c['truth']:>7.2f}{c['slope']:>7.3f}"
                f"{c['error_constant']:>10.3f}{c['error_trend']:>7.3f}"
            )
        lines.append(f"{'':<16}carries: {entry['carries']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    report = run()
    OUT.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))


if __name__ == "__main__":
    main()
