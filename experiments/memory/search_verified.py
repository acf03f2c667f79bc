"""The plan search's top plans, each verified: its predicted peak beside the peak its trace under fake tensors gives.

    python -m experiments.memory.search_verified [--nodes 32] [--trials 200] [--top 5] [--model URI]

Llama 3.1 70B (experiments/requests/llama-3.1-70b.json) on H100 nodes of 8, searched for time as the explorer
searches it, but over the plans the collector runs, so that each can be traced (collect.fake): bfloat16 GEMMs
and no context parallelism (the collector has no FP8 path, and torch's context parallelism does not shard the
CPU's attention). The search's best plans are traced one after another (serve.verify.run), and
experiments/results/search_verified.json gets each plan, its prediction, its trace, the prediction over the trace
(both allocated) and the trace with what a GPU adds at the median (collect.fake.device.on_device).
"""

from __future__ import annotations

import argparse
import json
import time

from collect import REPO
from serve.api import load_predictor
from serve.schemas import PredictRequest, SearchRequest
from serve.search.space import Space
from serve.search.study import search
from serve.verify.cost import CLI_SECONDS
from serve.verify.run import verify

WORKLOAD = json.loads((REPO / "experiments" / "requests" / "llama-3.1-70b.json").read_text())
OUT = REPO / "experiments" / "results" / "search_verified.json"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--model", default="models:/plansight@champion")
    args = parser.parse_args(argv)
    predictor = load_predictor(args.model)
    cluster = {"preset": "h100-80gb", "nodes": args.nodes}
    request = SearchRequest(workload=WORKLOAD, cluster=cluster, trials=args.trials, top_k=args.top)
    space = Space(request.workload, request.cluster.cluster(), request.micro_batch_sizes, context_parallel=(1,),
                  framework=request.framework)  # fmt: skip
    start = time.monotonic()
    found = search(predictor, request, space=space)
    searched_s, rows = time.monotonic() - start, []
    for best in found.best:
        workload = {**WORKLOAD, "micro_batch_size": best.micro_batch_size}
        one = PredictRequest(workload=workload, cluster=cluster, plans=[best.plan.model_dump()])
        (plan,) = verify(predictor, one, CLI_SECONDS).plans
        rows.append({"plan": best.plan.model_dump(), "micro_batch_size": best.micro_batch_size,
                     **plan.model_dump(mode="json", exclude={"simulated"})})  # fmt: skip
        print(_line(rows[-1]), flush=True)
    ratios = [r["predicted_over_traced"] for r in rows if r["predicted_over_traced"]]
    summary = {
        "request": request.model_dump(mode="json"),
        "searched_s": searched_s,
        "plans": rows,
        "within_5_percent": sum(abs(r - 1) <= 0.05 for r in ratios),
        "traced": len(ratios),
        "model": found.model,
    }
    OUT.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{summary['within_5_percent']} of {len(ratios)} traced plans predicted within 5% of their trace")
    return 0


def _line(row: dict) -> str:
    p = row["plan"]
    plan = f"dp{p['dp']} tp{p['tp']} pp{p['pp']} {p['sharding']} {p['recompute']} mbs{row['micro_batch_size']}"
    if row["status"] != "ok":
        return f"{plan}: {row['status']} {row['error']}"
    predicted, traced = row["prediction"]["peak_mem_bytes"] / 2**30, row["traced_peak_bytes"] / 2**30
    on_gpu, ratio, took = row["traced_on_gpu_bytes"] / 2**30, row["predicted_over_traced"], row["wall_s"]
    return (f"{plan}: predicted {predicted:.1f} GiB, traced {traced:.1f} GiB ({ratio:.3f}x), {on_gpu:.1f} with "
            f"what a GPU adds, in {took:.0f} s")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
