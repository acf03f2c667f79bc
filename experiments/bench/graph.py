"""Graph-build and simulation speed: typical plans per second, and one 1,024-GPU plan.

    python -m experiments.bench.graph [--rows 400] [--repeats 5]

Typical plans are rows of data/runs (CPU and A100). The large plan is a
96-layer, 12,288-wide GPT on 128 nodes x 8 A100s (pp8 x dp16 x tp8,
interleaved 1F1B, 64 micro-batches). Each timing is the median of repeats.
Cold: the layout and placement caches are cleared before each repeat, so a
pipeline shape's first plan pays for them (within one repeat, later plans of
the shape share them, as in any batch); warm: they are kept from the repeat
before, as in a long-running service.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from collect.schema import RunSpec
from gnn.costs.hardware import hardware_model
from gnn.dataset.rows import load_runs, row_to_spec
from gnn.graph.build import build_graph, clear_caches
from gnn.sim.simulate import simulate

LARGE = {
    "workload": dict(
        layers=96,
        hidden=12288,
        heads=96,
        seq_len=2048,
        vocab=51200,
        micro_batch_size=1,
        global_batch_size=1024,
        dtype="bfloat16",
    ),
    "plan": dict(
        pp=8,
        dp=16,
        tp=8,
        num_microbatches=64,
        pp_schedule="interleaved_1f1b",
        virtual_stages=2,
        sharding="fsdp_grad_op",
    ),
    "cluster": dict(nodes=128, devices_per_node=8, device="cuda", backend="nccl", memory_bytes=80 * 2**30),
}


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _median_sims(build, repeats: int) -> float:
    """Simulating freshly built graphs, caches cleared first: nothing derived from an earlier repeat."""
    times = []
    for _ in range(repeats):
        clear_caches()
        graphs = build()
        start = time.perf_counter()
        for g in graphs:
            simulate(g)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    df = load_runs(sorted(Path("data/runs").glob("*.parquet"))).sample(frac=1.0, random_state=0).head(args.rows)
    inputs = []
    for row in df.to_dict("records"):
        spec, hw, _ = row_to_spec(row)
        inputs.append((spec, hardware_model(hw)))

    def build_all():
        return [build_graph(s.workload, s.plan, s.cluster, hw) for s, hw in inputs]

    def cold(fn):
        return lambda: (clear_caches(), fn())

    graphs = build_all()
    warm_build, warm_sim = (
        _median_time(build_all, args.repeats),
        _median_time(lambda: [simulate(g) for g in graphs], args.repeats),
    )
    cold_build = _median_time(cold(build_all), args.repeats)
    cold_sim = _median_sims(build_all, args.repeats)
    large = RunSpec.model_validate(LARGE)
    a100 = hardware_model("a100-80gb")

    def build_large():
        return build_graph(large.workload, large.plan, large.cluster, a100)

    big = build_large()
    result = {
        "typical_plans": len(inputs),
        "median_nodes": int(statistics.median(g.num_nodes for g in graphs)),
        "graphs_built_per_s": round(len(inputs) / cold_build, 1),
        "simulations_per_s": round(len(inputs) / cold_sim, 1),
        "graphs_built_per_s_warm": round(len(inputs) / warm_build, 1),
        "simulations_per_s_warm": round(len(inputs) / warm_sim, 1),
        "large_plan": {
            "gpus": large.cluster.world_size,
            "nodes": big.num_nodes,
            "edges": big.edge_index.shape[1],
            "build_s": round(_median_time(cold(build_large), args.repeats), 4),
            "build_s_warm": round(_median_time(build_large, args.repeats), 4),
            "simulate_s": round(_median_sims(lambda: [build_large()], args.repeats), 4),
            "simulated_iter_time_s": round(simulate(big).iter_time_s, 3),
        },
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
