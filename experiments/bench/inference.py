"""Batched inference speed: plans per second through the whole path, graph building included.

    python -m experiments.bench.inference [--repeats 3] [--model models:/plansight@champion]

The batch is every valid plan (960) of the demo's search workload, a GPT of
20 layers, hidden 1536, seq 1024, global batch 64, on 8 A100-80GB: the set a
plan search asks about. Timed separately: featurisation (compile + simulate + features)
and the ensemble's forward pass, then the served path, Predictor.predict_columns,
which overlaps the two (the headline figure): inline (0 workers), with 1 worker
process (the default on 2 cores) and with one per core. Each figure is the
median of repeats. The workers are started before timing: starting them takes
seconds (each imports torch), once per process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from collect.schema import Cluster, Workload
from gnn.inference.workers import CHUNK
from serve.api import load_predictor
from serve.search.space import Space

WORKLOAD = Workload(
    layers=20,
    hidden=1536,
    heads=16,
    seq_len=1024,
    vocab=51200,
    micro_batch_size=1,
    global_batch_size=64,
    dtype="bfloat16",
)
CLUSTER = Cluster(
    nodes=1, devices_per_node=8, device="cuda", device_kind="a100-80gb", memory_bytes=80 * 2**30, backend="nccl"
)


def bench(predictor, specs, workers: int, repeats: int) -> dict:
    featurize, forward, total = [], [], []
    predictor.predict_columns(specs[:CHUNK], "a100-80gb", workers=workers)  # (re)start this many workers
    for _ in range(repeats):
        t0 = time.perf_counter()
        graphs = [g for g, _ in predictor.featurize(specs, "a100-80gb", workers=workers)]
        t1 = time.perf_counter()
        predictor.ensemble.predict(graphs)
        t2 = time.perf_counter()
        predictor.predict_columns(specs, "a100-80gb", workers=workers)  # the served path: both, overlapped
        t3 = time.perf_counter()
        featurize.append(t1 - t0)
        forward.append(t2 - t1)
        total.append(t3 - t2)
    f, n, t = statistics.median(featurize), statistics.median(forward), statistics.median(total)
    return {
        "workers": workers,
        "plans": len(specs),
        "nodes": sum(g.num_nodes for g in graphs),
        "predict_s": t,
        "plans_per_s": len(specs) / t,
        "featurize_s": f,
        "forward_s": n,
        "featurize_plans_per_s": len(specs) / f,
        "forward_plans_per_s": len(specs) / n,
        "all_predict_s": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="models:/plansight@champion")
    parser.add_argument("--out", default="experiments/results/bench_inference.json")
    args = parser.parse_args()
    predictor = load_predictor(args.model)
    specs = Space(WORKLOAD, CLUSTER).enumerate()
    results = [bench(predictor, specs, w, args.repeats) for w in sorted({0, 1, os.cpu_count() or 1})]
    report = {"model": predictor.info, "members": len(predictor.ensemble.members), "results": results}
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    for r in results:
        print(
            f"{r['plans']} plans ({r['nodes']} graph nodes), {r['workers']} featurisation worker(s): "
            f"{r['plans_per_s']:.0f} plans/s "
            f"(featurize {r['featurize_plans_per_s']:.0f}/s, ensemble forward {r['forward_plans_per_s']:.0f}/s)"
        )


if __name__ == "__main__":
    main()
