"""python -m experiments.memory.gloo_staging: see the package's docstring."""

from __future__ import annotations

import argparse
import json

import numpy as np
from tqdm import tqdm

from collect.launch.pool import LocalPool
from collect.measure.plan import MeasureSettings
from experiments.memory.fake import CODE, RESULTS, compared, measured_rows, read_journal
from experiments.memory.gloo_staging import __doc__ as about
from experiments.memory.gloo_staging import in_place_collectives

OUT = RESULTS / "gloo_staging.json"


def proof_code() -> str:
    """The code of the proof's latest traces (experiments.memory.fake's CODE when it ran)."""
    return read_journal(RESULTS / "fake_vs_real.jsonl")[-1]["code"]


def off_ranks(over: float, code: str) -> list[dict]:
    """The proof's traced ranks more than ``over`` from the median of their re-measurements, both of ``code``."""
    again: dict[str, list] = {}
    for run_id, peaks, *made_by in read_journal(RESULTS / "fake_vs_rerun.jsonl"):
        if made_by == [code]:
            again.setdefault(run_id, []).append(peaks)
    out = []
    for plan in read_journal(RESULTS / "fake_vs_real.jsonl"):
        if plan.get("code") != code or "error" in plan or plan["run_id"] not in again:
            continue
        for rank in plan["ranks"]:
            runs = [peaks[rank["rank"]] for peaks in again[plan["run_id"]]]
            if abs(rank["peak_mem_bytes"] / np.median(runs) - 1) > over:
                described = {k: plan[k] for k in ("run_id", "family", "sharding", "pipelined")}
                out.append({**described, "rank": rank["rank"], "traced": rank["peak_mem_bytes"], "as_collected": runs})
    return out


def measure_in_place(ranks: list[dict], repeats: int) -> None:
    rows = measured_rows().drop_duplicates("run_id").set_index("run_id", drop=False)
    rows = {run_id: rows.loc[run_id] for run_id in {r["run_id"] for r in ranks}}
    settings = MeasureSettings(warmup_iters=0, timed_iters=1)
    peaks: dict[str, list] = {}
    with in_place_collectives():
        for run_id in tqdm(sorted(rows), desc="measuring in place", unit="plan"):
            with LocalPool(int(rows[run_id]["world_size"]), settings) as pool:
                peaks[run_id] = [pool.run(compared(rows[run_id])).peak_mem_bytes_per_rank for _ in range(repeats)]
    for rank in ranks:
        rank["in_place"] = [int(p[rank["rank"]]) for p in peaks[rank["run_id"]]]


def summary(ranks: list[dict]) -> dict:
    def worst(key: str) -> float:
        return float(max(abs(r["traced"] / np.median(r[key]) - 1) for r in ranks)) if ranks else 0.0

    errors = {f"max_abs_error_{key}": worst(key) for key in ("as_collected", "in_place")}
    return {"proof_code": proof_code(), "code": CODE, **errors, "ranks": ranks}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=about.split("\n\n")[0])
    parser.add_argument("--over", type=float, default=0.01, help="ranks further than this from their trace")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    ranks = off_ranks(args.over, proof_code())
    measure_in_place(ranks, args.repeats)
    report = summary(ranks)
    OUT.write_text(json.dumps(report, indent=1) + "\n")
    for r in ranks:
        print(r["run_id"], r["rank"], r["family"], r["sharding"], r["traced"], r["as_collected"], r["in_place"])
    print({k: v for k, v in report.items() if k.startswith("max")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
