"""Single-GPU peaks of the collector's own model code beside its fake-tensor trace: what fake tensors cannot see.

    python -m experiments.memory.gpu_peaks --out rows.jsonl [--deadline-s 420]     (on a machine with one GPU)

Each plan runs in a process of its own, so every reading starts from a fresh CUDA context and caching allocator:
the plan is built and stepped as the collector measures it (collect.measure.plan: its build and two optimizer
steps, under NCCL with a world of 1), and the process records
- ``max_allocated``: torch.cuda.max_memory_allocated over that window, the collector's peak;
- ``max_requested``: the bytes the code asked for at that peak's high-water mark (the allocator rounds each
  block up to 512 bytes, or to 2 MiB segments for large ones);
- ``max_reserved``: torch.cuda.max_memory_reserved, what the caching allocator held from the driver;
- ``context_bytes``: the device's used memory once CUDA is up and before anything is allocated (the context);
- ``device_used``: the device's used memory after the window (context, NCCL's and cuBLAS's own buffers, reserved);
then, after the group is closed, the same plan traced under fake tensors on the GPU (``fake_cuda``, the GPU's
kernels: flash attention's saved statistics) in that process. A plan that does not fit is a row with ``oom``.
Rows are appended as they end; plans over the deadline are not started. The CPU side is added afterwards, where no
GPU is needed: ``--fake-cpu ROWS`` traces each row's plan on the CPU's kernels (resumable, one process per plan,
experiments/results/gpu_vs_fake.jsonl) and summarises real against traced (experiments/results/gpu_vs_fake.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from collect import REPO
from collect.schema import RunSpec

RESULTS = REPO / "experiments" / "results"

H100 = {"device": "cuda", "device_kind": "h100", "memory_bytes": 85520809984, "backend": "nccl"}
# HF configs' shapes (config.json of each): Qwen2.5-0.5B, Llama 3.2 1B and 3B, Llama 3.1 8B, OLMoE-1B-7B, GPT-2 medium
SHAPES = {
    "qwen2.5-0.5b": dict(family="llama", layers=24, hidden=896, heads=14, kv_heads=2, ffn_hidden=4864,
                         vocab=151936, tied_embeddings=True),
    "llama3.2-1b": dict(family="llama", layers=16, hidden=2048, heads=32, kv_heads=8, ffn_hidden=8192,
                        vocab=128256, tied_embeddings=True),
    "llama3.2-3b": dict(family="llama", layers=28, hidden=3072, heads=24, kv_heads=8, ffn_hidden=8192,
                        vocab=128256, tied_embeddings=True),
    "llama3.1-8b": dict(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                        vocab=128256),
    "olmoe-1b-7b": dict(family="moe", layers=16, hidden=2048, heads=16, kv_heads=16, ffn_hidden=1024,
                        experts=64, top_k=8, expert_ffn_hidden=1024, vocab=50304),
    "gpt2-medium": dict(family="gpt", layers=24, hidden=1024, heads=16, vocab=50304),
}  # fmt: skip
# (shape, seq, micro-batch, recompute, plan extras): small first, so a short lease still covers every kind
PLANS = [
    ("qwen2.5-0.5b", 4096, 1, "none", {}),
    ("llama3.2-1b", 4096, 1, "none", {}),
    ("gpt2-medium", 1024, 8, "none", {}),
    ("llama3.2-1b", 4096, 2, "selective", {}),
    ("llama3.2-1b", 4096, 4, "full", {}),
    ("qwen2.5-0.5b", 4096, 4, "selective", {}),
    ("llama3.2-3b", 4096, 1, "none", {}),
    ("llama3.2-3b", 8192, 1, "full", {}),
    ("llama3.2-3b", 4096, 2, "selective", {}),
    ("llama3.2-1b", 4096, 2, "none", {"fp32_master_weights": True, "fp32_grads": True}),
    ("olmoe-1b-7b", 2048, 1, "full", {}),
    ("llama3.1-8b", 2048, 1, "full", {}),
    ("llama3.1-8b", 4096, 1, "selective", {}),
    ("llama3.2-3b", 4096, 2, "none", {"fp32_master_weights": True, "fp32_grads": True}),
    ("qwen2.5-0.5b", 8192, 2, "none", {}),
    ("olmoe-1b-7b", 4096, 2, "selective", {}),
    ("llama3.1-8b", 8192, 1, "full", {}),
    ("llama3.2-3b", 8192, 4, "full", {}),
    ("llama3.1-8b", 4096, 2, "none", {}),
    ("llama3.1-8b", 2048, 1, "full", {"fp32_master_weights": True, "fp32_grads": True}),
]
EXPANDABLE = "expandable_segments:True"  # torchtitan's default allocator setting: repeated for the first plans


def spec_of(shape: str, seq: int, mbs: int, recompute: str, extras: dict) -> RunSpec:
    workload = {**SHAPES[shape], "seq_len": seq, "micro_batch_size": mbs, "global_batch_size": mbs,
                "dtype": "bfloat16"}  # fmt: skip
    plan = {"dp": 1, "recompute": recompute, **extras}
    return RunSpec.model_validate({"workload": workload, "plan": plan, "cluster": {"devices_per_node": 1, **H100}})


def run_plan(spec: RunSpec) -> dict:
    """In this process (fresh, one GPU): the collector's memory window for real, then the fake trace."""
    import torch  # lazy: the driver never touches CUDA; only a plan's own process does
    import torch.distributed as dist  # lazy: as above

    from collect.measure.trainer import PlanTrainer  # lazy: as above

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info(device)
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(device), "total_bytes": total,
           "context_bytes": total - free, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}  # fmt: skip
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    try:
        trainer = PlanTrainer(spec, device)
        for _ in range(2):
            trainer.step()
        torch.cuda.synchronize(device)
        out["oom"] = False
    except torch.OutOfMemoryError as err:
        out.update(oom=True, error=str(err).splitlines()[0])
    out["real_s"] = time.perf_counter() - start
    stats = torch.cuda.memory_stats(device)
    free, _ = torch.cuda.mem_get_info(device)
    out.update(
        max_allocated=torch.cuda.max_memory_allocated(device),
        max_reserved=torch.cuda.max_memory_reserved(device),
        max_requested=stats.get("requested_bytes.all.peak"),
        reserved_now=torch.cuda.memory_reserved(device),
        device_used=total - free,
        alloc_retries=stats.get("num_alloc_retries"),
    )
    trainer = None
    dist.destroy_process_group()
    torch.cuda.empty_cache()
    try:
        from collect.fake.trace import trace  # lazy: torch of another version may lack what it patches

        out["fake_cuda"] = trace(spec, 0, "cuda")
    except Exception as err:  # what torch could not trace is recorded, never hidden
        out["fake_cuda_error"] = f"{type(err).__name__}: {str(err)[:400]}"
    return out


def drive(out: Path, deadline_s: float) -> None:
    done = {json.loads(line)["key"] for line in out.read_text().splitlines()} if out.exists() else set()
    jobs = [(p, "") for p in PLANS] + [(p, EXPANDABLE) for p in PLANS[:8]]
    start = time.monotonic()
    for index, (plan, conf) in enumerate(jobs):
        key = json.dumps([*plan, conf])
        if key in done:
            continue
        left = deadline_s - (time.monotonic() - start)
        if left < 30:
            print(f"deadline: {key} and the rest not started", flush=True)
            break
        env = {
            **os.environ,
            "PYTORCH_CUDA_ALLOC_CONF": conf,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(29500 + index),
        }
        spec = spec_of(*plan)
        cmd = [sys.executable, "-m", "experiments.memory.gpu_peaks", "--one", spec.model_dump_json()]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=min(left, 120))
            row = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {
                "error": proc.stderr[-600:]}  # fmt: skip
        except subprocess.TimeoutExpired:
            row = {"error": "timed out"}
        row = {"key": key, "spec": json.loads(spec.model_dump_json()), **row}
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(key, {k: row.get(k) for k in ("max_allocated", "max_reserved", "oom", "fake_cuda", "error")}, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.memory.gpu_peaks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=Path("gpu_peaks.jsonl"))
    parser.add_argument("--deadline-s", type=float, default=420)
    parser.add_argument("--one", help="(internal) one plan's RunSpec JSON, run in this process")
    parser.add_argument("--fake-cpu", type=Path, help="rows from a GPU run: trace each on the CPU and summarise")
    args = parser.parse_args(argv)
    if args.fake_cpu:
        from experiments.memory.gpu_overhead import compare  # lazy: pandas and numpy only for the summary

        compare(args.fake_cpu)
        return 0
    if args.one:
        print(json.dumps(run_plan(RunSpec.model_validate_json(args.one))))
        return 0
    drive(args.out, args.deadline_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
