"""The leave-one-source-out report: how wrong the predictor is on a source it never saw, and what K probe runs fix.

    python -m experiments.sources.report [--rows experiments/results/loso_rows.csv]

Reads experiments.sources.loso's rows. For each held-out source and K = 0, 1, 3 and 10, the source's K cheapest
runs (fewest GPU-seconds per iteration) are its probe and the rest are predicted. The calibration applied to a
source (gnn.inference.new_source: tau, within) is fitted on the other sources' rows only, so no source
calibrates its own interval. Each line gives median APE, MAPE, bias (geometric mean of predicted over measured),
80% coverage and median interval width (hi / lo); at K = 0 also the same model's in-distribution interval and
point ("before": what the served model said before this calibration), the rule of thumb's median APE, and the
picks' regret where a source has several runs of one model on one GPU count. Writes
experiments/results/loso.json and prints the table. The calibration fitted on every source ships with the champion
(make ship-champion: gnn.tracking.shipped export --new-source).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd

from collect import REPO
from experiments.sources.loso import ROWS
from gnn.inference import new_source
from gnn.inference.probe import Z_UPPER, MachineCorrection

OUT = REPO / "experiments" / "results" / "loso.json"
PROBES = (0, 1, 3, 10)
MIN_ROWS = 20  # timed runs a source needs to be reported on


def probe_shift(calibration: dict, probe: pd.DataFrame, rest: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(log shift, its sd) at each of ``rest``'s world sizes, from the probe runs' residuals under the prior of the
    other sources."""
    c = calibration["time"]
    r = np.log(probe["iter_time_s"] / probe["pred_time_s"]).to_numpy()
    prior = (c["tau"], 0.0, c["within"] / Z_UPPER)
    correction = MachineCorrection(tuple(r), tuple(probe["world_size"]), prior, slope_sd=c.get("slope_sd", 0.0))
    return correction.shift(rest["world_size"].to_numpy())


def stats(measured: np.ndarray, point: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> dict:
    ape = np.abs(point / measured - 1)
    return {
        "n": int(len(measured)),
        "mdape": float(np.median(ape)),
        "mape": float(ape.mean()),
        "bias": float(np.exp(np.log(point / measured).mean())),
        "coverage": float(((measured >= lo) & (measured <= hi)).mean()),
        "width": float(np.median(hi / lo)),
    }


def source_records(name: str, rows: pd.DataFrame, others: pd.DataFrame) -> list[dict]:
    calibration = new_source.fit(others)
    timed = rows[(rows["status"] == "ok") & rows["iter_time_s"].notna()]
    timed = timed.assign(cost=timed["world_size"] * timed["iter_time_s"]).sort_values("cost", kind="stable")
    records = []
    for k in PROBES:
        if len(timed) - k < MIN_ROWS // 2:
            continue
        probe, rest = timed.iloc[:k], timed.iloc[k:]
        shift, sd = probe_shift(calibration, probe, rest) if k else (0.0, calibration["time"]["tau"])
        before = time_columns(rest)
        after = new_source.widen(before, {"time": calibration["time"]}, sd)
        moved = [after[c] * np.exp(shift) for c in new_source.INTERVALS["time"]]
        measured = rest["iter_time_s"].to_numpy(dtype=float)
        record = {"source": name, "target": "time", "k": k, **stats(measured, *moved)}
        if k == 0:
            record["before"] = stats(measured, *before.values())
            record["rule_mdape"] = float(np.nanmedian(np.abs(rest["rule_time_s"] / measured - 1)))
            record |= picks(rows, calibration)
        records.append(record)
    records += memory_records(name, rows, calibration)
    return records


def time_columns(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """The rows' time predictions under the served model's column names (new_source.INTERVALS)."""
    predicted = ("pred_time_s", "pred_time_lo_s", "pred_time_hi_s")
    return {k: rows[c].to_numpy(dtype=float) for k, c in zip(new_source.INTERVALS["time"], predicted)}


def memory_records(name: str, rows: pd.DataFrame, calibration: dict) -> list[dict]:
    """Memory at K = 0 (a probe moves time only): the in-distribution interval, and the new-source one where the
    other sources measured memory in enough numbers to say how sources differ (MIN_SOURCES)."""
    kept = rows[(rows["status"] == "ok") & rows["peak_mem_bytes"].notna()]
    if len(kept) < MIN_ROWS:
        return []
    measured = kept["peak_mem_bytes"].to_numpy(dtype=float)
    columns = {c: kept[c].to_numpy(dtype=float) for c in ("pred_mem_bytes", "pred_mem_lo_bytes", "pred_mem_hi_bytes")}
    record = {"source": name, "target": "memory", "k": 0, "before": stats(measured, *columns.values())}
    if "memory" in calibration:
        named = dict(zip(new_source.INTERVALS["memory"], columns.values()))
        out = new_source.widen(named, {"memory": calibration["memory"]})
        record |= stats(measured, *(out[c] for c in new_source.INTERVALS["memory"]))
    return [record]


def picks(rows: pd.DataFrame, calibration: dict) -> dict:
    """Per (model, GPU count) with two runs that ran: the run ranked fastest among those predicted to fit, by its
    point and by its time at the 0.9 quantile (the search's time_quantile: the upper end of its interval, widened
    by the other sources' calibration); each pick's regret (measured time over the fastest measured, less one) and
    whether it failed."""
    upper = new_source.widen(time_columns(rows), {"time": calibration["time"]})["iter_time_hi_s"]
    out = {}
    for suffix, ranked in (("", rows["pred_time_s"]), ("_q90", upper)):
        regrets, failed = [], 0
        for _, group in rows.assign(ranked=ranked).groupby(["family", "num_params", "world_size"]):
            ran = group[(group["status"] == "ok") & group["iter_time_s"].notna()]
            fits = group[group["pred_mem_bytes"] <= group["memory_bytes"]]
            if len(ran) < 2 or fits.empty:
                continue
            pick = fits.loc[fits["ranked"].idxmin()]
            if pick["status"] != "ok":
                failed += 1
                continue
            regrets.append(pick["iter_time_s"] / ran["iter_time_s"].min() - 1)
        if regrets or failed:
            regret = float(np.median(regrets)) if regrets else None
            out |= {"groups": len(regrets) + failed, f"picks_failed{suffix}": failed, f"median_regret{suffix}": regret}
    return out


def report(rows: pd.DataFrame) -> list[dict]:
    timed = rows[(rows["status"] == "ok") & rows["iter_time_s"].notna()].groupby("source").size()
    records = []
    for name in sorted(timed[timed >= MIN_ROWS].index):
        records += source_records(name, rows[rows["source"] == name], rows[rows["source"] != name])
    return records


def table(records: list[dict]) -> str:
    frame = pd.json_normalize(records)
    cols = ["source", "target", "k", "n", "mdape", "mape", "bias", "coverage", "width"]
    extra = ("before.mdape", "before.bias", "before.coverage", "before.width", "rule_mdape", "groups")
    extra += ("picks_failed", "median_regret", "picks_failed_q90", "median_regret_q90")
    cols += [c for c in extra if c in frame]
    return frame[cols].round(3).to_string(index=False)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=str(ROWS))
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    records = report(pd.read_csv(args.rows))
    with open(args.out, "w") as f:
        json.dump(records, f, indent=1)
        f.write("\n")
    print(table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
