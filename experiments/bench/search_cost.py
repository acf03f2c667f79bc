"""What one plan search costs, as the HTTP service runs it (a study in memory): wall time and the process's
resident-memory high-water mark above what it held before, for a sampled search at the trial limit and an
exhaustive one over the demo's space, beside what serve.search.budget estimated before it ran and what its meter
charged as it ran (no budget: the search runs to the end).

    python -m experiments.bench.search_cost [--model models:/plansight@champion] [--out FILE]

Each search runs in a fresh process (``--case``), after the predictor is loaded and has answered once.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from collect import REPO
from serve.api import load_predictor
from serve.schemas import MAX_SEARCH_TRIALS, SearchRequest
from serve.search.budget import Meter
from serve.search.study import estimate, search, space_of

WORKLOAD = json.loads((REPO / "experiments" / "requests" / "gpt-20l-1536.json").read_text())
CASES = {
    f"optuna, {MAX_SEARCH_TRIALS:,} trials (the limit), 4 x 8 A100s": {"sampler": "optuna", "trials": MAX_SEARCH_TRIALS,
                                                                       "cluster": {"preset": "a100-80gb", "nodes": 4}},
    "exhaustive, the demo's space on 8 A100s": {"sampler": "exhaustive", "trials": MAX_SEARCH_TRIALS,
                                                "cluster": {"preset": "a100-80gb"}},
}  # fmt: skip


def run_case(model: str, label: str) -> dict:
    predictor = load_predictor(model)
    request = SearchRequest.model_validate({"workload": WORKLOAD, **CASES[label]})
    search(predictor, request.model_copy(update={"trials": 32, "sampler": "optuna"}))  # warm: graphs, numba
    space = space_of(request)
    priced, meter = estimate(request, space), Meter(None)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    response = search(predictor, request, space=space, meter=meter)
    wall = time.perf_counter() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    return {"case": label, "wall_s": wall, "rss_high_water_growth_bytes": grown, "trials": response.trials,
            "distinct_plans": response.distinct_plans, "best_s": response.best[0].prediction.iter_time_s,
            "estimated_s": priced.seconds, "estimated_parts_s": priced.parts, "metered_s": meter.spent,
            "measured_over_estimated": wall / priced.seconds, "estimated_bytes": priced.bytes}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models:/plansight@champion")
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "search_cost.json"))
    parser.add_argument("--case", help=argparse.SUPPRESS)  # a child process runs one case
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.model, args.case)))
        return
    results = []
    for label in CASES:
        cmd = [sys.executable, "-m", "experiments.bench.search_cost", "--model", args.model, "--case", label]
        results.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
        r = results[-1]
        grown = r["rss_high_water_growth_bytes"] / 2**20
        print(f"{label}: {r['wall_s']:.1f} s (estimated {r['estimated_s']:.1f}), +{grown:.0f} MiB "
              f"(estimated {r['estimated_bytes'] / 2**20:.0f}), {r['trials']} trials", flush=True)  # fmt: skip
    with open(args.out, "w") as f:
        json.dump({"model": args.model, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
