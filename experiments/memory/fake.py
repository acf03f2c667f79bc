"""The fake-tensor tracer (collect.fake) against the counting allocator: real CPU peaks of the same plans.

    python -m experiments.memory.fake [--plans 240] [--workers 2]

Draws plans from the CPU rows whose peak the counting allocator measured (data/runs), spread over every family,
sharding, recompute and layout the collector ran (a seeded draw, at most --plans, the same per stratum), traces
each pipeline rank's first rank under fake tensors in a process of its own, and sets the traced peak beside the
measured one of that rank. A mixture of experts is traced with every expert routed the same number of tokens,
where the real router's counts follow its data, and CPU collectives on gloo make copies a fake group does not:
both show in the errors by family and by sharding. Resumable: each traced plan is appended to
experiments/results/fake_vs_real.jsonl as it ends; the summary is experiments/results/fake_vs_real.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
from tqdm import tqdm

from collect import REPO
from collect.store import ResultStore
from gnn.dataset.rows import row_to_spec

RESULTS = REPO / "experiments" / "results"
STRATA = ["family", "sharding", "recompute", "pipelined", "tensor_parallel", "expert_parallel"]


def measured_rows() -> pd.DataFrame:
    rows = pd.concat([ResultStore(p).load() for p in sorted((REPO / "data" / "runs").glob("*.parquet"))])
    rows = rows[(rows["device"] == "cpu") & (rows["status"] == "ok")]
    rows = rows[(rows["peak_mem_method"] == "counting-allocator") & ~rows["is_reference"].fillna(False).astype(bool)]
    ep = rows["ep"].fillna(1) if "ep" in rows else 1
    return rows.assign(pipelined=rows["pp"] > 1, tensor_parallel=rows["tp"] > 1, expert_parallel=ep > 1)


def drawn(rows: pd.DataFrame, plans: int, seed: int = 0) -> pd.DataFrame:
    """At most ``plans`` distinct plans (one measurement each), as many from every stratum as it holds up to an
    even share."""
    rows = rows.drop_duplicates("run_id")
    groups = list(rows.groupby(STRATA, dropna=False))
    share = max(1, plans // len(groups))
    picked = pd.concat([g.sample(min(len(g), share), random_state=seed) for _, g in groups])
    rest = rows.drop(picked.index)
    extra = rest.sample(min(len(rest), max(plans - len(picked), 0)), random_state=seed)
    return pd.concat([picked, extra]).head(plans)


def traced(row: pd.Series) -> dict:
    """Each pipeline rank's first rank traced, beside what that rank measured."""
    spec, _, _ = row_to_spec(row)
    measured = list(row["peak_mem_bytes_per_rank"])
    stride = len(measured) // int(row["pp"])
    out = {"run_id": row["run_id"], **{k: _plain(row[k]) for k in STRATA}, "ranks": []}
    for pp_rank in range(int(row["pp"])):
        rank = pp_rank * stride
        command = [sys.executable, "-m", "collect.fake.trace", spec.model_dump_json(), "--rank", str(rank)]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            return {**out, "error": (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        result = json.loads(done.stdout.strip().splitlines()[-1])
        out["ranks"].append({"rank": rank, "measured": int(measured[rank]), **result})
    return out


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def summary(results: list[dict]) -> dict:
    ok = [r for r in results if "error" not in r]
    frame = pd.DataFrame(
        [
            {**{k: r[k] for k in STRATA}, "error": x["peak_mem_bytes"] / x["measured"] - 1}
            for r in ok
            for x in r["ranks"]
        ]
    )
    errors = frame["error"].abs()

    def by(column: str) -> dict:
        grouped = frame.assign(abs=errors).groupby(column)["abs"]
        return {str(k): {"ranks": int(len(v)), "median": float(v.median()), "max": float(v.max())} for k, v in grouped}

    return {
        "plans": len(results),
        "traced": len(ok),
        "failed": [r for r in results if "error" in r],
        "ranks": len(frame),
        "median_abs_error": float(errors.median()),
        "p90_abs_error": float(np.quantile(errors, 0.9)),
        "max_abs_error": float(errors.max()),
        "bias": float(np.exp(np.log1p(frame["error"]).mean())),
        "cpu_s_per_rank": float(np.median([x["cpu_s"] for r in ok for x in r["ranks"]])),
        "by_family": by("family"),
        "by_sharding": by("sharding"),
        "by_pipelined": by("pipelined"),
        "by_expert_parallel": by("expert_parallel"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", type=int, default=240)
    parser.add_argument("--workers", type=int, default=2, help="plans traced at once (a process each)")
    args = parser.parse_args()
    journal = RESULTS / "fake_vs_real.jsonl"
    done = [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []
    seen = {r["run_id"] for r in done}
    todo = [row for _, row in drawn(measured_rows(), args.plans).iterrows() if row["run_id"] not in seen]
    with open(journal, "a") as out, ThreadPoolExecutor(args.workers) as pool:
        for result in tqdm(pool.map(traced, todo), total=len(todo), desc="tracing plans", unit="plan"):
            out.write(json.dumps(result) + "\n")
            out.flush()
            done.append(result)
    report = summary(done)
    (RESULTS / "fake_vs_real.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if not k.startswith("by_") and k != "failed"}, indent=1))
    for key in ("by_family", "by_sharding", "by_pipelined", "by_expert_parallel"):
        print(key, json.dumps(report[key]))


if __name__ == "__main__":
    main()
