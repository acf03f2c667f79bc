"""The probe: a few cheap reference plans measured on a machine the model has never seen, with a fresh fingerprint.

A fingerprint carries what a machine's matmuls, copies, collectives and blocks cost, but not everything a sitting
of it moves (data/README.md, Sittings). The probe measures K real plans there, stored like any sweep's rows
(data/runs/<name>.parquet), so that a prediction can be corrected by what they show without retraining
(gnn.inference.probe; `python -m serve predict SPEC.json --probe NAME`, the HTTP field ``probe``).

Which plans: on the local CPU ranks, the first K of collect/sweeps/probe-cpu.yaml, ordered so that every prefix
spreads over world sizes 1, 2 and 4 and the three families (experiments.sittings.plans chose them among the
plans every sitting measures); on GPUs under torchrun, a small Llama at the job's world size (cuda_points).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from collect.inputs import InputError
from collect.schema import Cluster, Plan, RunSpec, Workload
from collect.sweep import SweepSpec

CPU_PROBES = Path(__file__).parent / "sweeps" / "probe-cpu.yaml"
DEFAULT_K = 3
# a Llama-3-like block small enough to run on any GPU in seconds (~0.5B parameters)
CUDA_SHAPE = dict(family="llama", layers=8, hidden=2048, heads=16, kv_heads=8, ffn_hidden=5632, seq_len=2048,
                  vocab=32000, dtype="bfloat16")  # fmt: skip


def default_name() -> str:
    return time.strftime("probe-%Y%m%dT%H%M%S", time.gmtime())


def probe_spec(k: int, name: str, gpus: dict | None = None) -> SweepSpec:
    """The probe as a sweep: K plans, measured once each (no repeats, no reference plan: they are the reference).
    ``gpus``: under torchrun, cuda_points' arguments (the job's GPUs); None: the local CPU ranks."""
    if k < 1:
        raise InputError(f"error: --k must be at least 1, got {k}")
    if gpus is not None:
        kind = gpus["device_kind"]
        base = SweepSpec(name=name, points=cuda_points(**gpus), device="cuda", backend="nccl", device_kind=kind)
    else:
        base = SweepSpec.from_yaml(CPU_PROBES)
    if k > len(base.points):
        raise InputError(f"error: --k {k}: the probe has {len(base.points)} plans on this machine kind")
    return base.model_copy(
        update={"name": name, "points": base.points[:k], "repeat_fraction": 0.0, "reference_every": 10**9}
    )


def cuda_points(world_size: int, devices_per_node: int, memory_bytes: int, device_kind: str) -> list[RunSpec]:
    """Three plans of the probe shape on the job's GPUs: data-parallel (compute and the gradient all-reduce), the
    same with full recompute (compute again), and with tensor parallelism within a node where there are two GPUs
    or more (its collectives), else a larger micro-batch (compute at another size)."""
    per_node = min(world_size, devices_per_node)
    cluster = Cluster(nodes=world_size // per_node, devices_per_node=per_node, memory_bytes=memory_bytes,
                      device="cuda", backend="nccl", device_kind=device_kind)  # fmt: skip
    tp = 2 if per_node >= 2 else 1
    plans = [
        (1, Plan(dp=world_size, tp=1, pp=1, num_microbatches=1)),
        (1, Plan(dp=world_size, tp=1, pp=1, num_microbatches=1, recompute="full")),
        (1 if tp > 1 else 2, Plan(dp=world_size // tp, tp=tp, pp=1, num_microbatches=1)),
    ]
    out = []
    for mbs, plan in plans:
        workload = Workload(**CUDA_SHAPE, micro_batch_size=mbs, global_batch_size=mbs * plan.dp)
        out.append(RunSpec(workload=workload, plan=plan, cluster=cluster))
    return out


def job_gpus(device_kind: str) -> dict:
    """cuda_points' arguments for this torchrun job: its world size, GPUs per node and one GPU's memory."""
    world = int(os.environ["WORLD_SIZE"])
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    memory = torch.cuda.get_device_properties(int(os.environ.get("LOCAL_RANK", 0))).total_memory
    return {"world_size": world, "devices_per_node": per_node, "memory_bytes": memory, "device_kind": device_kind}
