"""Plans per minute: long-lived ranks (LocalPool) vs one launch per plan.

    python -m experiments.bench.pool [--plans 8] [--repeats 3]

Both arms measure the same tiny 2-rank plans with the same settings; "launch
per plan" starts a fresh pool (spawn, import torch, gloo rendezvous) for each
plan, which is what a torchrun-per-plan collector pays. Each arm is repeated and
the median reported, with the spread, because timings here move by 25%.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from collect.launch.pool import LocalPool
from collect.measure.plan import MeasureSettings
from collect.schema import RunSpec

SETTINGS = MeasureSettings(warmup_iters=0, timed_iters=3)
PLANS = [
    dict(dp=2),
    dict(dp=2, sharding="zero1"),
    dict(dp=2, sharding="fsdp_full"),
    dict(tp=2),
    dict(pp=2, pp_schedule="1f1b", num_microbatches=2),
    dict(dp=2, recompute="full"),
    dict(dp=2, sharding="fsdp_grad_op"),
    dict(pp=2, pp_schedule="gpipe", num_microbatches=2),
]


def _spec(plan: dict) -> RunSpec:
    w = dict(layers=2, hidden=64, heads=4, seq_len=32, vocab=256, micro_batch_size=2)
    w["global_batch_size"] = plan.get("dp", 1) * 2 * plan.get("num_microbatches", 1)
    return RunSpec.model_validate(
        {"workload": w, "plan": plan, "cluster": {"devices_per_node": 2, "memory_bytes": 2**30}}
    )


def pooled(specs) -> float:
    start = time.perf_counter()
    with LocalPool(2, SETTINGS) as pool:
        for spec in specs:
            assert pool.run(spec).status == "ok"
    return time.perf_counter() - start


def launch_per_plan(specs) -> float:
    start = time.perf_counter()
    for spec in specs:
        with LocalPool(2, SETTINGS) as pool:
            assert pool.run(spec).status == "ok"
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    specs = [_spec(PLANS[i % len(PLANS)]) for i in range(args.plans)]
    result = {}
    for name, arm in (("pool", pooled), ("launch_per_plan", launch_per_plan)):
        rates = [60 * len(specs) / arm(specs) for _ in range(args.repeats)]
        result[name] = {
            "plans_per_min_median": round(statistics.median(rates), 1),
            "plans_per_min_all": [round(r, 1) for r in rates],
        }
    result["speedup"] = round(
        result["pool"]["plans_per_min_median"] / result["launch_per_plan"]["plans_per_min_median"], 2
    )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
