"""Searches and /explain against their budgets, over real HTTP: what the most expensive requests the limits allow
cost (wall time and the server tree's resident memory above idle), what they were estimated to cost, and how
/predict and /health answer beside them.

    python -m experiments.bench.search_budget [--model models:/plansight@champion] [--only NAME ...]

Starts `python -m serve serve` on a free loopback port with the model (its featurisation workers up), then runs
each drill in turn on the idle server, sampling the tree's RSS every 20 ms (experiments.bench.request_cost.tree_rss):
- issue-52: the 283-byte POST /search of issue 52, then the same as a background search (it stops at its budget);
- sync-max: the costliest synchronous search the budget admits (its estimate just under it);
- job-max: a background search far over its budget (Llama 70B on 64 x 8 H100s, 5,000 trials), stopped there;
- four-at-once: two synchronous and two background searches at once;
- busy: a 1-plan /predict and /health, 40 times each, while two 5,000-trial background searches run;
- hang-ups: a /explain and a search whose clients hang up, and a DELETE of a running search: seconds to idle;
- explain-edges: /explain of the largest dense and mixture-of-experts plans the budget admits, and smaller ones,
  measured / estimated (gnn.inference.cost.explain_cost);
- in-memory: without the server, a 5,000-trial TPE search and an exhaustive one, run whole in a fresh process each
  (as the service runs them, a study in memory): wall time and resident high-water growth beside what
  serve.search.budget estimated and metered (the sampler's prices come from these).
Writes experiments/results/search_budget.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from collect import REPO
from collect.schema import Plan
from experiments.bench.http import Watch, call, finished, hang_up, idle_after, start_server
from experiments.bench.request_cost import tree_rss
from gnn.inference.cost import explain_cost
from serve.api import load_predictor
from serve.schemas import MAX_SEARCH_TRIALS, SearchRequest
from serve.search.budget import JOB, SEARCH, Meter, checked, estimate
from serve.search.space import space_of
from serve.search.study import search

LLAMA_70B = json.loads((REPO / "experiments" / "requests" / "llama-3.1-70b.json").read_text())
ISSUE_SEARCH = {
    "workload": {"layers": 256, "hidden": 1024, "heads": 1, "seq_len": 1022, "vocab": 32000, "micro_batch_size": 1,
                 "global_batch_size": 512, "dtype": "bfloat16"},
    "cluster": {"preset": "a100-80gb", "nodes": 32},
    "micro_batch_sizes": [1],
    "trials": 300,
}  # fmt: skip
LONG_SEARCH = {"workload": LLAMA_70B, "cluster": {"preset": "h100-80gb", "nodes": 64}, "trials": 5000}
PREDICT = {"workload": LLAMA_70B, "cluster": {"preset": "h100-80gb", "nodes": 4}, "plans": [{"dp": 4, "tp": 8}]}
GPT = {"layers": 32, "hidden": 1024, "heads": 16, "seq_len": 1024, "vocab": 51200, "micro_batch_size": 1,
       "global_batch_size": 4096, "dtype": "bfloat16"}  # fmt: skip
MOE = {"family": "moe", "layers": 256, "hidden": 4096, "heads": 32, "kv_heads": 8, "seq_len": 8192, "vocab": 32000,
       "micro_batch_size": 1, "global_batch_size": 1024, "dtype": "bfloat16", "experts": 8, "top_k": 2,
       "expert_ffn_hidden": 14336}  # fmt: skip
DENSE = {"family": "llama", "layers": 256, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
         "seq_len": 4096, "vocab": 128256, "micro_batch_size": 1, "global_batch_size": 1024,
         "dtype": "bfloat16"}  # fmt: skip


def estimated(body: dict, budget) -> dict:
    request = SearchRequest.model_validate(body)
    return checked(request, budget, refuse_over_time=False)[1].summary()


def largest_sync_search() -> dict:
    """The search with the most trials whose estimate stays within the synchronous budget (70B on 4 x 8 H100s)."""
    body = {"workload": LLAMA_70B, "cluster": {"preset": "h100-80gb", "nodes": 4}}
    best = None
    for trials in range(100, 1001, 25):
        if estimated({**body, "trials": trials}, SEARCH)["seconds"] <= SEARCH.seconds:
            best = trials
    return {**body, "trials": best}


def drill_issue_52(base: str, pid: int) -> dict:
    idle = tree_rss(pid)
    with Watch(pid, idle) as sync:
        status, body, seconds = call(base, "POST", "/search", ISSUE_SEARCH)
    out = {"sync": {"status": status, "seconds": round(seconds, 3), "mib_over_idle": sync.mib,
                    "detail": body.get("detail")}}  # fmt: skip
    started, answer, wall, mib = background(base, pid, ISSUE_SEARCH)
    out["background"] = {
        "seconds": round(wall, 2), "mib_over_idle": mib, "estimate": started["estimate"],
        "budget_s": started["budget"]["seconds"], "stopped_by": answer["stopped_by"], "trials": answer["trials"],
        "space_size": answer["space_size"], "over_budget_plans": answer["over_budget_plans"],
        "best_s": answer["best"][0]["prediction"]["iter_time_s"] if answer["best"] else None,
    }  # fmt: skip
    return out


def drill_sync_max(base: str, pid: int) -> dict:
    body = largest_sync_search()
    with Watch(pid, tree_rss(pid)) as w:
        status, answer, seconds = call(base, "POST", "/search", body)
    est = estimated(body, SEARCH)
    return {"trials": body["trials"], "status": status, "seconds": round(seconds, 2), "mib_over_idle": w.mib,
            "estimate": est, "measured_over_estimated": round(seconds / est["seconds"], 2),
            "stopped_by": answer.get("stopped_by")}  # fmt: skip


def background(base: str, pid: int, body: dict) -> tuple[dict, dict, float, float]:
    """A background search run to its end: what POST /searches said, its answer, its wall time and MiB."""
    with Watch(pid, tree_rss(pid)) as w:
        t0 = time.perf_counter()
        started = call(base, "POST", "/searches", body)[1]
        done = finished(base, started["id"])
        wall = time.perf_counter() - t0
    return started, done["response"], wall, w.mib


def drill_job_max(base: str, pid: int) -> dict:
    started, answer, wall, mib = background(base, pid, LONG_SEARCH)
    return {"seconds": round(wall, 1), "mib_over_idle": mib, "estimate": started["estimate"],
            "budget_s": JOB.seconds, "stopped_by": answer["stopped_by"], "trials": answer["trials"],
            "stop_reason": answer["stop_reason"]}  # fmt: skip


def drill_four_at_once(base: str, pid: int) -> dict:
    sync_body = largest_sync_search()
    with Watch(pid, tree_rss(pid)) as w:
        t0 = time.perf_counter()
        jobs = [call(base, "POST", "/searches", {**ISSUE_SEARCH, "seed": s})[1]["id"] for s in (1, 2)]
        results: list = []
        threads = [
            threading.Thread(target=lambda s=s: results.append(call(base, "POST", "/search", {**sync_body, "seed": s})))
            for s in (1, 2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        states = [finished(base, j)["state"] for j in jobs]
        wall = time.perf_counter() - t0
    return {"seconds": round(wall, 1), "mib_over_idle": w.mib, "sync_statuses": sorted(r[0] for r in results),
            "background_states": states}  # fmt: skip


def drill_busy(base: str, pid: int) -> dict:
    jobs = [call(base, "POST", "/searches", {**LONG_SEARCH, "seed": s})[1]["id"] for s in (1, 2)]
    while call(base, "GET", "/health")[1]["slots"]["heavy"]["running"] < 2:
        time.sleep(0.05)
    predict, health = [], []
    for _ in range(40):
        predict.append(call(base, "POST", "/predict", PREDICT)[2])
        health.append(call(base, "GET", "/health")[2])
        time.sleep(0.25)
    t0 = time.perf_counter()
    for j in jobs:
        call(base, "DELETE", f"/searches/{j}")
    stopped = idle_after(base, t0)
    ms = [1000 * s for s in predict]
    return {"predict_ms": {"p50": round(statistics.median(ms), 1), "max": round(max(ms), 1)},
            "health_ms": {"p50": round(1000 * statistics.median(health), 1), "max": round(1000 * max(health), 1)},
            "delete_to_idle_s": stopped}  # fmt: skip


def drill_hang_ups(base: str, pid: int) -> dict:
    explain = explain_body(DENSE, 128, 1024, 16)
    search = {"workload": GPT, "cluster": {"preset": "h100-80gb", "nodes": 4}, "trials": 300}
    return {
        "explain_idle_after_s": hang_up(base, "/explain", explain, 1.0),
        "search_idle_after_s": hang_up(base, "/search", search, 1.0),
        "ten_explains_idle_after_s": _ten_hang_ups(base, explain),
    }


def _ten_hang_ups(base: str, body: dict) -> float:
    threads = [threading.Thread(target=hang_up, args=(base, "/explain", body, 1.0)) for _ in range(10)]
    for t in threads:
        t.start()
    t0 = time.perf_counter() + 1.0
    for t in threads:
        t.join()
    return idle_after(base, t0)


def explain_body(workload: dict, pp: int, microbatches: int, nodes: int, **plan) -> dict:
    return {
        "workload": {**workload, "global_batch_size": microbatches * plan.get("dp", 1)},
        "cluster": {"preset": "h100-80gb", "nodes": nodes},
        "plans": [{"pp": pp, "pp_schedule": "1f1b", "num_microbatches": microbatches, **plan}],
    }


def largest_pp(microbatches: int, **plan) -> int:
    """The deepest pipeline whose /explain the budget admits."""
    ok = [pp for pp in range(8, 257, 8) if explain_cost(Plan(pp=pp, pp_schedule="1f1b", num_microbatches=microbatches,
                                                              **plan)).seconds <= SEARCH.seconds]  # fmt: skip
    return max(ok)


def drill_explain_edges(base: str, pid: int) -> dict:
    moe = {"tp": 8, "cp": 8, "ep": 8}
    cases = {
        "dense pp 8 x 64": (DENSE, 8, 64, {}),
        "dense pp 64 x 1024": (DENSE, 64, 1024, {}),
        "dense, deepest admitted x 1024": (DENSE, largest_pp(1024), 1024, {}),
        "moe tp8 cp8 ep8 pp 64 x 1024": (MOE, 64, 1024, moe),
        "moe tp8 cp8 ep8, deepest admitted x 1024": (MOE, largest_pp(1024, **moe), 1024, moe),
    }
    rows = []
    for name, (workload, pp, microbatches, plan) in cases.items():
        nodes = pp * plan.get("tp", 1) * plan.get("cp", 1) // 8
        body = explain_body(workload, pp, microbatches, max(nodes, 1), **plan)
        estimated = explain_cost(Plan(pp=pp, pp_schedule="1f1b", num_microbatches=microbatches, **plan))
        with Watch(pid, tree_rss(pid)) as w:
            status, _, seconds = call(base, "POST", "/explain", body)
        predict = [call(base, "POST", "/predict", PREDICT)[2] for _ in range(5)]
        rows.append({"case": name, "pp": pp, "status": status, "seconds": round(seconds, 2),
                     "estimated_seconds": round(estimated.seconds, 2),
                     "measured_over_estimated": round(seconds / estimated.seconds, 2), "mib_over_idle": w.mib,
                     "estimated_mib": round(estimated.peak_bytes / 2**20),
                     "predict_after_ms": round(1000 * statistics.median(predict), 1)})  # fmt: skip
    return {"cases": rows, "worst_time_ratio": max(r["measured_over_estimated"] for r in rows)}


GPT_20L = json.loads((REPO / "experiments" / "requests" / "gpt-20l-1536.json").read_text())
IN_MEMORY = {
    f"optuna, {MAX_SEARCH_TRIALS:,} trials (the limit), 4 x 8 A100s": {"sampler": "optuna", "trials": MAX_SEARCH_TRIALS,
                                                                       "cluster": {"preset": "a100-80gb", "nodes": 4}},
    "exhaustive, the demo's space on 8 A100s": {"sampler": "exhaustive", "trials": MAX_SEARCH_TRIALS,
                                                "cluster": {"preset": "a100-80gb"}},
}  # fmt: skip


def in_memory_case(model: str, label: str) -> dict:
    """In this (fresh) process: one search of IN_MEMORY, after a warm-up one, run whole."""
    predictor = load_predictor(model)
    request = SearchRequest.model_validate({"workload": GPT_20L, **IN_MEMORY[label]})
    search(predictor, request.model_copy(update={"trials": 32, "sampler": "optuna"}))  # warm: graphs, numba
    space = space_of(request)
    priced, meter = estimate(request, space), Meter(None)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    response = search(predictor, request, space=space, meter=meter)
    wall = time.perf_counter() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    return {"case": label, "wall_s": round(wall, 1), "mib_grown": round(grown / 2**20), "trials": response.trials,
            "distinct_plans": response.distinct_plans, "estimated_s": round(priced.seconds, 1),
            "estimated_parts_s": {k: round(v, 2) for k, v in priced.parts.items()},
            "metered_s": round(meter.spent, 1), "measured_over_estimated": round(wall / priced.seconds, 2),
            "estimated_mib": round(priced.bytes / 2**20)}  # fmt: skip


def in_memory(model: str) -> list[dict]:
    command = [sys.executable, "-m", "experiments.bench.search_budget", "--model", model, "--case"]
    run = [subprocess.run([*command, label], check=True, capture_output=True, text=True) for label in IN_MEMORY]
    return [json.loads(done.stdout) for done in run]


DRILLS = {
    "issue-52": drill_issue_52,
    "sync-max": drill_sync_max,
    "job-max": drill_job_max,
    "four-at-once": drill_four_at_once,
    "busy": drill_busy,
    "hang-ups": drill_hang_ups,
    "explain-edges": drill_explain_edges,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models:/plansight@champion")
    parser.add_argument("--only", nargs="*", choices=[*DRILLS, "in-memory"], help="run these drills only")
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "search_budget.json"))
    parser.add_argument("--case", help=argparse.SUPPRESS)  # a child process runs one in-memory search
    args = parser.parse_args()
    if args.case:
        print(json.dumps(in_memory_case(args.model, args.case)))
        return
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() and args.only else {}
    if "in-memory" in (args.only or ["in-memory"]):
        report["in-memory"] = in_memory(args.model)
        print(f"in-memory: {json.dumps(report['in-memory'])}", flush=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
    proc, client = start_server(args.model)
    try:
        for name in [d for d in args.only or list(DRILLS) if d in DRILLS]:
            t0 = time.perf_counter()
            report[name] = DRILLS[name](client.base_url, proc.pid)
            print(f"{name} ({time.perf_counter() - t0:.0f} s): {json.dumps(report[name])}", flush=True)
            out.write_text(json.dumps(report, indent=1) + "\n")  # each drill kept as it ends
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
