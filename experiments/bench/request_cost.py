"""What a prediction request really costs here, beside what gnn.inference.cost estimates for it.

    python -m experiments.bench.request_cost [--model PATH_OR_URI] [--out experiments/results/request_cost.json]

Each case runs in a fresh process, as the service would run it: the predictor loaded and warmed up, its
featurisation workers started, then one predict_columns call over the case's plans (H100 preset). Measured: the
call's wall time, and the high-water mark of the resident memory of the process and its workers above what they
held just before (sampled every 20 ms from /proc). Reported per case beside the estimate, and the largest
measured / estimated ratio, for time and memory: the constants in gnn.inference.cost are set so these stay
at or below 1. The cost depends on the ensemble's size, not its weights: any model with the default TrainConfig's
architecture gives the champion's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

CASES = [  # (label, pp, virtual stages, micro-batches, plans)
    ("1 plan, no pipeline", 1, 1, 1, 1),
    ("1 plan, pp 8 x 64", 8, 1, 64, 1),
    ("1 plan, pp 32 x 128", 32, 1, 128, 1),
    ("1 plan, pp 64 x 128", 64, 1, 128, 1),
    ("1 plan, pp 128 x 256", 128, 1, 256, 1),
    ("1 plan, pp 64 x 2 interleaved x 256", 64, 2, 256, 1),
    ("1 plan, pp 256 x 512", 256, 1, 512, 1),
    ("1 plan, pp 256 x 1024", 256, 1, 1024, 1),
    ("16 plans, pp 32 x 64", 32, 1, 64, 16),
    ("16 plans, pp 64 x 128", 64, 1, 128, 16),
    ("128 plans, pp 16 x 32", 16, 1, 32, 128),
    ("512 plans, pp 4 x 8", 4, 1, 8, 512),
    ("2,000 plans, pp 2 x 4", 2, 1, 4, 2000),
    ("10,000 plans, no pipeline", 1, 1, 1, 10000),
    ("1,000 plans, pp 16 x 26", 16, 1, 26, 1000),
    ("48 different plans, pp 16-128 on 256 GPUs", 0, 1, 0, 48),  # pp 0: mixed_specs, which caches cannot share
    # pp -1: moe_specs, a DeepSeek-V3-shaped model (latent attention, 256 experts) in MXFP8 on 1,024 GB200s
    ("1 MoE plan, pp 128 x 1024, ep 8", -1, 1, 1024, 1),
    ("48 different MoE plans, pp 16-128, ep 8-64", -1, 1, 0, 48),
    # pp -2: moe_parallel_specs, a Mixtral-shaped model with every parallelism that adds nodes to a pass
    ("1 MoE plan, pp 104 x 1024, tp 8 cp 8 ep 8, FSDP, full recompute", -2, 1, 1024, 1),
    ("8 MoE plans, pp 64 x 1024, tp 8 cp 8 ep 8, FSDP, full recompute", -2, 1, 1024, 8),
]
MOE_HARDWARE = "gb200-nvl72"


def specs(pp: int, virtual: int, microbatches: int, n: int):
    # lazy: only the child process that runs a case imports the schema, the model and torch
    from collect.schema import Cluster, Plan, RunSpec, Workload

    if pp == 0:
        return mixed_specs(n)
    if pp == -1:
        return moe_specs(microbatches, n)
    if pp == -2:
        return moe_parallel_specs(104 if n == 1 else 64, microbatches, n)

    stages = pp * virtual
    w = Workload(
        family="llama", layers=max(32, stages), hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
        seq_len=4096, vocab=128256, micro_batch_size=1, global_batch_size=microbatches, dtype="bfloat16",
    )  # fmt: skip
    schedule = None if pp == 1 else ("interleaved_1f1b" if virtual > 1 else "1f1b")
    plan = Plan(pp=pp, pp_schedule=schedule, virtual_stages=virtual, num_microbatches=microbatches)
    cluster = Cluster(
        nodes=max(1, pp // 8), devices_per_node=min(8, pp), device="cuda", device_kind="h100-80gb",
        memory_bytes=80 * 2**30, backend="nccl",
    )  # fmt: skip
    return [RunSpec(workload=w, plan=plan, cluster=cluster)] * n


def mixed_specs(n: int):
    """``n`` plans of a Llama 8B on 256 H100s that share no layout and few passes: pipelines of 16 to 128 stages
    (1,024 to 8,192 micro-batches, simulated short), each sharding and recompute."""
    # lazy: only the child process that runs a case imports the schema
    from collect.schema import Cluster, Plan, RunSpec, Workload

    w = Workload(
        family="llama", layers=128, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, seq_len=4096,
        vocab=128256, micro_batch_size=1, global_batch_size=16384, dtype="bfloat16",
    )  # fmt: skip
    cluster = Cluster(
        nodes=32, devices_per_node=8, device="cuda", device_kind="h100-80gb", memory_bytes=80 * 2**30,
        backend="nccl",
    )  # fmt: skip
    plans = [
        Plan(pp=pp, dp=256 // pp, pp_schedule="1f1b", num_microbatches=16384 * pp // 256, sharding=sh, recompute=rc)
        for pp in (16, 32, 64, 128)
        for sh in ("none", "zero1", "fsdp_grad_op", "fsdp_full")
        for rc in ("none", "selective", "full")
    ]
    return [RunSpec(workload=w, plan=p, cluster=cluster) for p in plans[:n]]


def moe_specs(microbatches: int, n: int):
    """DeepSeek-V3's config with 128 layers (1.4T parameters, under the 2T limit) on 1,024 GB200s in MXFP8, under
    Megatron's conventions: one plan (pp 128, ep 8, ``microbatches``), or ``n`` that share no layout (pp 16 to
    128, ep 8 to 64, each sharding and recompute)."""
    # lazy: only the child process that runs a case imports the schema
    import json

    from collect import REPO
    from collect.schema import Cluster, Plan, RunSpec, Workload, framework_conventions

    config = json.loads((REPO / "experiments" / "requests" / "hf" / "deepseek-v3.config.json").read_text())
    w = Workload.from_hf_config(
        {**config, "num_hidden_layers": 128}, seq_len=4096, micro_batch_size=1, global_batch_size=8192, float8="mxfp8"
    )
    cluster = Cluster(
        nodes=16, devices_per_node=64, device="cuda", device_kind=MOE_HARDWARE, memory_bytes=180 * 2**30,
        backend="nccl",
    )  # fmt: skip
    conventions = {**framework_conventions("megatron", 1, False, "bfloat16"), "moe_dispatcher": "hybrid", "etp": 1}

    def plan(pp: int, ep: int, sharding: str = "zero1", recompute: str = "none", batches: int = 0) -> Plan:
        dp = 1024 // pp
        return Plan(
            pp=pp, dp=dp, ep=ep, pp_schedule="1f1b", num_microbatches=batches or 8192 // dp, sharding=sharding,
            recompute=recompute, **conventions,
        )  # fmt: skip

    if n == 1:
        w = w.model_copy(update={"global_batch_size": 8 * microbatches})
        return [RunSpec(workload=w, plan=plan(128, 8, batches=microbatches), cluster=cluster)]
    plans = [
        plan(pp, ep, sh, rc)
        for pp, ep in ((16, 64), (32, 32), (64, 16), (128, 8))
        for sh in ("none", "zero1", "fsdp_grad_op", "fsdp_full")
        for rc in ("none", "selective", "full")
    ]
    return [RunSpec(workload=w, plan=p, cluster=cluster) for p in plans[:n]]


def moe_parallel_specs(pp: int, microbatches: int, n: int):
    """``n`` identical plans of a Mixtral-shaped model of ``pp`` layers, pp x tp 8 x cp 8 with ep 8, FSDP and full
    recompute: the most nodes a pass can hold (gnn.inference.cost.nodes_per_pass)."""
    # lazy: only the child process that runs a case imports the schema
    from collect.schema import Cluster, Plan, RunSpec, Workload

    w = Workload(
        family="moe", layers=pp, hidden=4096, heads=32, kv_heads=8, seq_len=8192, vocab=32000, micro_batch_size=1,
        global_batch_size=microbatches, dtype="bfloat16", experts=8, top_k=2, expert_ffn_hidden=14336,
    )  # fmt: skip
    plan = Plan(pp=pp, tp=8, cp=8, ep=8, sharding="fsdp_full", recompute="full", sequence_parallel=True,
                pp_schedule="1f1b", num_microbatches=microbatches)  # fmt: skip
    cluster = Cluster(nodes=pp * 8, devices_per_node=8, device="cuda", device_kind="h100-80gb",
                      memory_bytes=80 * 2**30, backend="nccl")  # fmt: skip
    return [RunSpec(workload=w, plan=plan, cluster=cluster)] * n


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and its children (the featurisation workers), from /proc."""
    total = 0
    for p in [pid, *_children(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def _children(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(c) for t in Path(f"/proc/{p}/task").iterdir() for c in (t / "children").read_text().split()]
        except OSError:
            continue
        out += kids
        todo += kids
    return out


def run_case(model: str, case: tuple) -> dict:
    """In this (fresh) process: the measured time and memory of one case, and its estimate."""
    # lazy: the parent process only launches cases, and must not hold torch's memory itself
    from gnn.inference.cost import request_cost
    from serve.api import load_predictor

    label, pp, virtual, microbatches, n = case
    predictor = load_predictor(model)
    predictor.warm_up()
    predictor.start_workers()
    plans = specs(pp, virtual, microbatches, n)
    peak, done = [tree_rss(os.getpid())], threading.Event()
    base = peak[0]

    def sample():
        while not done.wait(0.02):
            peak[0] = max(peak[0], tree_rss(os.getpid()))

    threading.Thread(target=sample, daemon=True).start()
    t0 = time.perf_counter()
    predictor.predict_columns(plans, MOE_HARDWARE if pp == -1 else "h100-80gb")
    seconds = time.perf_counter() - t0
    done.set()
    peak[0] = max(peak[0], tree_rss(os.getpid()))
    cost = request_cost(s.plan for s in plans)
    return {
        "case": label,
        "plans": n,
        "seconds": round(seconds, 3),
        "estimated_seconds": round(cost.seconds, 3),
        "peak_mib": round((peak[0] - base) / 2**20, 1),
        "estimated_peak_mib": round(cost.peak_bytes / 2**20, 1),
        "sim_nodes": round(cost.sim_nodes),
        "gnn_passes": cost.gnn_passes,
        "largest_graph_nodes": round(cost.largest_graph),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models:/plansight@champion")
    parser.add_argument("--out", default="experiments/results/request_cost.json")
    parser.add_argument("--case", type=int, help=argparse.SUPPRESS)  # a child process runs one case
    parser.add_argument("--only", type=int, nargs="*", help="run these cases (indices into CASES) only")
    args = parser.parse_args(argv)
    if args.case is not None:
        print(json.dumps(run_case(args.model, CASES[args.case])))
        return
    rows = []
    for i in args.only if args.only else range(len(CASES)):
        cmd = [sys.executable, "-m", "experiments.bench.request_cost", "--model", args.model, "--case", str(i)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(
            f"{r['case']:<40} {r['seconds']:7.2f} s (est {r['estimated_seconds']:6.2f})"
            f" {r['peak_mib']:8.1f} MiB (est {r['estimated_peak_mib']:8.1f})",
            flush=True,
        )
    # ratios where the estimate is over a tenth of a second: below, a start-up's jitter is all there is
    timed = [r for r in rows if r["estimated_seconds"] >= 0.1]
    worst = {
        "time": max(r["seconds"] / r["estimated_seconds"] for r in timed),
        "memory": max(r["peak_mib"] / r["estimated_peak_mib"] for r in rows),
    }
    print(f"largest measured / estimated: time {worst['time']:.2f}, memory {worst['memory']:.2f}")
    Path(args.out).write_text(json.dumps({"cases": rows, "worst_ratio": worst}, indent=1) + "\n")


if __name__ == "__main__":
    main()
