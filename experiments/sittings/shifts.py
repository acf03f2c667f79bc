"""How the CPU machine moves from one sitting to the next, and what of it its fingerprint saw.

A sitting is one sweep's stretch of the machine with its own fingerprint (cpu-v3, active-cpu, active-cpu-random,
cpu-sitting-*). For every plan measured in two sittings or more: its shift in a sitting is the log of its time
there over the plan's geometric mean over sittings. Per sitting: the median shift (what one number per machine
can carry), by world size and family (what it cannot), the spread around it, and the same sitting's fingerprint
(matmul, copy bandwidth, collectives, block profile and concurrency points) over the mean of the sittings'.

    python -m experiments.sittings.shifts    # prints the tables, writes experiments/results/sittings.json
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from gnn.dataset.rows import load_runs

SITTINGS = ("cpu-v3", "active-cpu", "active-cpu-random")
OUT = Path("experiments/results/sittings.json")


def sitting_rows(runs: Path = Path("data/runs")) -> pd.DataFrame:
    paths = [runs / f"{s}.parquet" for s in SITTINGS] + sorted(runs.glob("cpu-sitting-*.parquet"))
    rows = load_runs([p for p in paths if p.exists()])
    return rows[rows.status == "ok"]


def shifts(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (plan, sitting): the plan's log time there (median of its repeats) less its mean over sittings."""
    per = (
        rows.groupby(["run_id", "sweep_id"])
        .agg(
            t=("iter_time_s", "median"),
            world_size=("world_size", "first"),
            family=("family", "first"),
            tp=("tp", "first"),
            pp=("pp", "first"),
            fingerprint_id=("fingerprint_id", "first"),
        )
        .reset_index()
    )
    per["x"] = np.log(per.t)
    counts = per.groupby("run_id").sweep_id.transform("nunique")
    per = per[counts >= 2].copy()
    per["shift"] = per.x - per.groupby("run_id").x.transform("mean")
    return per


def repeat_floor(rows: pd.DataFrame) -> pd.DataFrame:
    """Per sitting: mean and median relative deviation of repeated measurements from their plan's median there."""
    rep = rows[rows.repeat_group.notna()]
    med = rep.groupby(["sweep_id", "repeat_group"]).iter_time_s.transform("median")
    dev = (rep.iter_time_s / med - 1).abs()
    return dev.groupby(rep.sweep_id).agg(["mean", "median", "count"])


def fingerprint_summary(fingerprint_id: str, hardware: Path = Path("data/hardware")) -> dict:
    """The fingerprint's few numbers that could carry a sitting's speed."""
    rec = json.loads((hardware / f"{fingerprint_id}.json").read_text())
    mm = {(p["dtype"], p["n"]): p["time_s"] for p in rec["compute"] if p["kind"] == "matmul"}
    bw = next(p["time_s"] for p in rec["compute"] if p["kind"] == "memory_bandwidth")
    coll = {(p["op"], p["group_size"], p["bytes"]): p["time_s"] for p in rec["collectives"]}
    blocks = [p["forward_s"] + p["backward_s"] for p in rec["blocks"] if p.get("kind") == "block"]
    conc = [p for p in rec["blocks"] if p.get("kind") == "concurrency"]
    out = {
        "matmul_fp32_256_s": mm.get(("float32", 256)),
        "matmul_fp32_1024_s": mm.get(("float32", 1024)),
        "copy_64MiB_s": bw,
        "blocks_geomean_s": float(np.exp(np.mean(np.log(blocks)))) if blocks else None,
    }
    for ws in (2, 4):
        small = [t for (op, g, b), t in coll.items() if op == "all_reduce" and g == ws and 1024 <= b <= 65536]
        big = [t for (op, g, b), t in coll.items() if op == "all_reduce" and g == ws and b >= 2**20]
        out[f"allreduce_small_ws{ws}_s"] = float(np.median(small)) if small else None
        out[f"allreduce_large_ws{ws}_s"] = float(np.median(big)) if big else None
    for p in conc:
        if p["hidden"] == max(c["hidden"] for c in conc):
            out[f"concurrency_ws{p['ranks']}_s"] = p["time_s"]
    steps = [p["step_s"] for p in rec["blocks"] if p.get("kind") == "optimizer"]
    out["optimizer_geomean_s"] = float(np.exp(np.mean(np.log(steps)))) if steps else None
    return out


def block_buckets(fingerprint_ids: list[str], hardware: Path = Path("data/hardware")) -> pd.DataFrame:
    """Each fingerprint's block profile against the mean of them all, per quartile of block time: the fixed cost
    of a block (dispatch, autograd) moves its smallest points, the machine's throughput its largest."""
    times = {}
    for fid in fingerprint_ids:
        rec = json.loads((hardware / f"{fid}.json").read_text())
        times[fid] = {
            f"{p['block']}|{p['variant']}|{p['hidden']}|{p['seq_len']}|{p['batch']}": p["forward_s"] + p["backward_s"]
            for p in rec.get("blocks", [])
            if p.get("kind") == "block"
        }
    table = pd.DataFrame(times).dropna()
    logs = np.log(table)
    logs = logs.sub(logs.mean(axis=1), axis=0)
    quartile = pd.qcut(table.mean(axis=1), 4, labels=["smallest", "small", "large", "largest"])
    return logs.groupby(quartile, observed=True).median().T


def main() -> None:
    rows = sitting_rows()
    per = shifts(rows)
    table = per.groupby("sweep_id").agg(
        plans=("shift", "size"),
        median=("shift", "median"),
        spread=("shift", lambda s: float((s - s.median()).abs().median())),
    )
    by_ws = per.pivot_table(index="sweep_id", columns="world_size", values="shift", aggfunc="median")
    by_family = per.pivot_table(index="sweep_id", columns="family", values="shift", aggfunc="median")
    finger = pd.DataFrame(
        {s: fingerprint_summary(per[per.sweep_id == s].fingerprint_id.iloc[0]) for s in table.index}
    ).T
    finger = np.log(finger.astype(float) / finger.astype(float).mean())  # log over the sittings' mean
    floor = repeat_floor(rows)
    cpu = sorted(p.stem for p in Path("data/hardware").glob("vm-*.json") if p.stem >= "vm-20261124")
    cpu = [f for f in cpu if json.loads(Path(f"data/hardware/{f}.json").read_text()).get("device") == "cpu"]
    buckets = block_buckets(cpu)
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.precision", 3):
        print("log shifts per sitting (median over plans; spread = median |shift - sitting median|)")
        print(table.join(by_ws.add_prefix("ws")).join(by_family))
        print("\nfingerprint, log of each sitting's value over the sittings' mean")
        print(finger.T)
        print("\nblock profile of each CPU fingerprint, log over their mean, by quartile of block time")
        print(buckets)
        print("\nrepeat noise floor per sitting (time)")
        print(floor)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "shifts": table.join(by_ws.add_prefix("ws")).join(by_family).to_dict("index"),
                "fingerprint": finger.to_dict("index"),
                "floor": floor.to_dict("index"),
            },
            indent=1,
            default=float,
        )
    )


if __name__ == "__main__":
    main()
