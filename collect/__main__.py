"""plansight collection from the shell.

    python -m collect measure SPEC.json [--allow-oom]  # one plan, prints its row as JSON
    python -m collect sweep collect/sweeps/default.yaml [--out data/runs] [--limit N] [--name ID] [--allow-oom]
    python -m gnn.acquire collect/sweeps/active-cpu.yaml  # sampler: active (a surrogate chooses the plans)
    python -m collect fingerprint [--world-sizes 1 2 4]   # this machine's fingerprint alone
    python -m collect probe [--k 3] [--model URI]         # fingerprint + K probe plans: collect.probe
    python -m collect kernels --out data/hardware/kernels/NAME.json  # this device's kernel table
    python -m collect workload --hf-config config.json --seq-len 4096 --micro-batch-size 1 --global-batch-size 256

SPEC.json is {"workload": {...}, "plan": {...}, "cluster": {...}} with the
field names of collect.schema. Invalid input is reported, field by field,
before any process starts, and so is a plan that cannot fit: a closed-form
lower bound of its largest rank's peak (collect.measure.fits) over
cluster.memory_bytes or over this machine's available memory shared by its
ranks (a sweep checks the machine only: its small capacities are oom labels).
`python -m serve predict SPEC.json` gives the simulator's and the surrogate's estimate.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

from pydantic import ValidationError

from collect.inputs import InputError, load_model, local_problems, read_json, run_reporting_errors, validation_lines
from collect.kernels import __main__ as kernels
from collect.launch.fingerprint import MAX_MESSAGE_BYTES, take_fingerprint
from collect.launch.pool import LocalPool
from collect.launch.result import build_row
from collect.launch.run import SweepRunner
from collect.launch.torchrun import fingerprint_on_ranks, init_torchrun, run_under_torchrun, under_torchrun
from collect.measure import cpu_alloc
from collect.measure.fits import refuse_unfit
from collect.measure.plan import MeasureSettings
from collect.probe import DEFAULT_K, default_name, job_gpus, probe_spec
from collect.schema import RunSpec, Workload
from collect.schema.hf import hf_fields
from collect.sweep import SweepSpec


def _load_spec(path: str) -> RunSpec:
    spec = load_model(path, RunSpec)
    problems = local_problems(spec)
    if problems:
        raise InputError("\n".join([f"error: {path} cannot be measured here:", *(f"  {p}" for p in problems)]))
    return spec


def cmd_measure(args) -> None:
    spec = _load_spec(args.spec)
    if not args.allow_oom:
        refuse_unfit([spec], args.spec)
    settings = MeasureSettings(warmup_iters=args.warmup, timed_iters=args.iters)
    with LocalPool(spec.cluster.world_size, settings, deadline_s=args.deadline) as pool:
        result = pool.run(spec)
    print(json.dumps(build_row(spec, result), indent=1))


def cmd_sweep(args) -> None:
    spec = SweepSpec.from_yaml(args.sweep)
    if args.name:  # one spec, measured again under another id: a sitting of the same plans on another day
        spec = spec.model_copy(update={"name": args.name})
    if spec.sampler == "active":
        raise InputError(
            f"error: {args.sweep}: sampler: active chooses plans with a surrogate model, which collect does not "
            f"import: run `python -m gnn.acquire {args.sweep}` (`make collect SWEEP={args.sweep}` does)"
        )
    if under_torchrun():  # GPU clusters: torchrun made the ranks, this process is one of them
        counts = run_under_torchrun(spec, args.out, args.limit, hardware_dir=args.hardware)
        if counts is not None:
            print(f"{spec.name}: {counts}")
        return
    counts = SweepRunner(spec, out_dir=args.out, hardware_dir=args.hardware).run(
        limit=args.limit, remeasure_memory=args.remeasure_memory, allow_oom=args.allow_oom
    )
    print(f"{spec.name}: {counts}")


def cmd_probe(args) -> None:
    name = args.name or default_name()
    if under_torchrun():  # a GPU job: the probe's plans at its world size, on its own GPUs
        spec = probe_spec(args.k, name, gpus=job_gpus(args.device_kind))
        counts = run_under_torchrun(spec, args.out, hardware_dir=args.hardware)
    else:
        spec = probe_spec(args.k, name).model_copy(update={"profile_blocks": not args.no_block_profile})
        counts = SweepRunner(spec, out_dir=args.out, hardware_dir=args.hardware).run()
    if counts is None:  # not rank 0
        return
    print(f"{name}: {counts}; rows in {Path(args.out) / name}.parquet")
    follow = [sys.executable, "-m", "serve", "probe", name, "--runs", args.out, "--hardware", args.hardware]
    if args.model:  # collect cannot import the model's package (collect -> gnn -> serve): the service reports it
        subprocess.run([*follow, "--model", args.model], check=False)
    else:
        print(f"predict with it: python -m serve predict SPEC.json --probe {name}")


def cmd_fingerprint(args) -> None:
    if 1 not in args.world_sizes or any(ws < 1 for ws in args.world_sizes):
        raise SystemExit(f"error: --world-sizes must hold 1 (compute and blocks run there), got {args.world_sizes}")
    if under_torchrun():  # GPUs: torchrun's ranks, on their own devices (--world-sizes does not apply)
        fingerprint_id = fingerprint_on_ranks(init_torchrun(300.0), args.max_bytes or MAX_MESSAGE_BYTES, args.hardware)
        if fingerprint_id:
            print(fingerprint_id)
        return
    with ExitStack() as stack:
        pools = {ws: stack.enter_context(LocalPool(ws)) for ws in sorted(set(args.world_sizes))}
        print(take_fingerprint(pools, args.max_bytes or MAX_MESSAGE_BYTES, Path(args.hardware), socket.gethostname()))


def cmd_workload(args) -> None:
    config = read_json(args.hf_config)
    batch = {"micro_batch_size": args.micro_batch_size, "global_batch_size": args.global_batch_size}
    try:
        workload = Workload.from_hf_config(config, seq_len=args.seq_len, dtype=args.dtype, **batch)
    except ValidationError as exc:
        raise InputError(
            "\n".join([f"error: {args.hf_config} is not a workload plansight covers:", *validation_lines(exc)])
        ) from None
    for note in hf_fields(config, args.seq_len)[1]:
        print(f"note: {note}", file=sys.stderr)
    dump = workload.model_dump(mode="json", exclude_defaults=True)
    print(json.dumps({"family": workload.family, **dump}, indent=1))


ALLOW_OOM_HELP = "run plans whose peak-memory lower bound is over the capacity (the kernel may kill them)"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collect", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="measure one plan")
    m.add_argument("spec")
    m.add_argument("--iters", type=int, default=5, help="timed iterations")
    m.add_argument("--warmup", type=int, default=2, help="untimed iterations after the memory window")
    m.add_argument("--deadline", type=float, default=300.0, help="seconds before the plan counts as hung")
    m.add_argument("--allow-oom", action="store_true", help=ALLOW_OOM_HELP)
    m.set_defaults(fn=cmd_measure)
    s = sub.add_parser("sweep", help="run (or resume) a sweep")
    s.add_argument("sweep")
    s.add_argument("--out", default="data/runs")
    s.add_argument("--hardware", default="data/hardware")
    s.add_argument("--limit", type=int, default=None, help="measure at most N more plans")
    s.add_argument(
        "--name", default=None, help="the sweep's id instead of the YAML's name (results go to OUT/NAME.parquet)"
    )
    s.add_argument(
        "--remeasure-memory",
        action="store_true",
        help="measure again the stored plans whose CPU peak an older accounting overstated "
        "(FSDP with dp > 1, tp > 1; see collect.measure.memory), and those read without the counting allocator",
    )
    s.add_argument("--allow-oom", action="store_true", help=ALLOW_OOM_HELP)
    s.set_defaults(fn=cmd_sweep)
    p = sub.add_parser("probe", help="measure the probe's few reference plans on this machine (about two minutes)")
    p.add_argument("--k", type=int, default=DEFAULT_K, help=f"probe plans to run (default {DEFAULT_K})")
    p.add_argument("--name", default=None, help="the probe's id (default probe-<UTC time>): OUT/NAME.parquet")
    p.add_argument("--model", default=None, help="a model URI: report how the probe corrects its predictions")
    p.add_argument("--device-kind", default="cuda", help="under torchrun: the GPU kind the rows name (e.g. h100)")
    p.add_argument("--out", default="data/runs")
    p.add_argument("--hardware", default="data/hardware")
    p.add_argument(
        "--no-block-profile",
        action="store_true",
        help="skip the fingerprint's block profile (~1 min; the project's tests): the model prices compute from it",
    )
    p.set_defaults(fn=cmd_probe)
    f = sub.add_parser("fingerprint", help="measure this machine's fingerprint (compute, blocks, collectives)")
    f.add_argument(
        "--world-sizes",
        type=int,
        nargs="+",
        default=[1, 2, 4],
        help="pools to measure collectives and concurrency on (must include 1)",
    )
    f.add_argument("--max-bytes", type=int, default=None, help="largest collective message (default 64 MiB)")
    f.add_argument("--hardware", default="data/hardware")
    f.set_defaults(fn=cmd_fingerprint)
    k = sub.add_parser("kernels", help="time the operators of the plans people run on this device: a kernel table")
    kernels.add_arguments(k)
    k.set_defaults(fn=kernels.run_from_args)
    w = sub.add_parser("workload", help="print the Workload JSON of a Hugging Face config.json")
    covered = "Llama, Mistral, Qwen2/3, Mixtral, Qwen-MoE, DeepSeek-V3, Kimi-K2, GPT-OSS"
    w.add_argument("--hf-config", required=True, help=f"a config.json ({covered})")
    w.add_argument("--seq-len", type=int, required=True)
    w.add_argument("--micro-batch-size", type=int, default=1)
    w.add_argument("--global-batch-size", type=int, required=True)
    w.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    w.set_defaults(fn=cmd_workload)
    args = parser.parse_args(argv)
    run_reporting_errors(_build_errors_in_one_line, args)


def _build_errors_in_one_line(args) -> None:
    try:
        args.fn(args)
    except cpu_alloc.BuildError as exc:  # the allocator's build failed, or its lock was held too long
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
