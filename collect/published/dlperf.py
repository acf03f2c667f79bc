"""DLPerf's Megatron-LM GPT runs on V100 (1 to 32 GPUs, 2021) as rows of data/runs.

    python -m collect.published.dlperf [--src data/external/published/dlperf_megatron_v100.csv]
                                       [--out data/runs/dlperf-v100.parquet]

Source (data/external/published/SOURCES.md, copied from ../shared/data/published): Oneflow-Inc/DLPerf
Megatron-LM/README.md at 01e43de: Megatron-LM at 8aa4619f on up to 4 nodes of 8 V100-SXM2-16GB, one 100 Gb/s EDR
InfiniBand HCA per node. Each case prints its iteration time and an nvidia-smi memory reading.

What is filled in, from the benchmark's own script (Megatron-LM/scripts/mutil_perf_pretrain_gpt_dp_mp_pp.sh at
the same commit): --fp16, --checkpoint-activations (full recompute), sequence 2048; and Megatron's conventions
at the time: its local DDP (sharding none), fp32 master weights with fp16 gradients, the vocabulary-parallel loss,
a 1F1B pipeline whose point-to-point buffers live only while used, and attention as a fused scale-mask-softmax over
scores it writes out (plan.attention 'eager'; Megatron's flash path came later).
Left out: the memory (nvidia-smi shows what the caching allocator reserved and the CUDA context, not the peak of
live tensors the rows mean), and the DeepSpeed rows (GPT-2 small at the script's defaults: neither the sequence
nor the iteration time is printed).
"""

from __future__ import annotations

import argparse
from collections import Counter

import pandas as pd

from collect.hardware.records import load_hardware
from collect.published.rows import convert_records, save, spec_columns
from collect.schema import RunSpec, framework_conventions

PRESET = "v100-16gb"


def spec_of(row: dict) -> RunSpec:
    """The plan a printed case describes; ValueError (naming what) when the schema cannot hold it."""
    tp, pp, dp, gpus = (int(row[k]) for k in ("tp", "pp", "dp", "gpus"))
    mbs, gbs = int(row["micro_batch"]), int(row["global_batch"])
    workload = {
        "family": "gpt",
        "layers": int(row["layers"]),
        "hidden": int(row["hidden"]),
        "heads": int(row["heads"]),
        "vocab": int(row["vocab"]),
        "seq_len": int(row["seq_len"]),
        "dtype": "float16",
        "micro_batch_size": mbs,
        "global_batch_size": gbs,
    }
    plan = {
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "sharding": "none",
        "recompute": "full",
        "num_microbatches": gbs // (mbs * dp),
        **framework_conventions("megatron", tp, False, "float16"),
        "attention": "eager",
        # Megatron-LM of 2021 reduced gradients after the backward (its local DDP), with no distributed optimizer
        "grad_reduce_overlap": False,
        "param_gather_overlap": False,
    }
    per_node = min(gpus, 8)
    cluster = {"nodes": gpus // per_node, "devices_per_node": per_node, "device": "cuda", "device_kind": "v100"}
    cluster |= {"backend": "nccl", "memory_bytes": load_hardware(PRESET)["memory_bytes"]}
    return RunSpec.model_validate({"workload": workload, "plan": plan, "cluster": cluster})


def convert(src: str) -> tuple[pd.DataFrame, Counter]:
    """(rows, reasons): each Megatron-LM case with its iteration time, and why the other printed rows are not."""
    long = pd.read_csv(src)
    cases = long[long["measured_metric_name"] == "iteration_time"]
    deepspeed = long[long["source"].str.contains("DeepSpeed/")].groupby(["gpus", "zero_stage"]).ngroups
    reasons = Counter({"DeepSpeed's GPT-2 small at its script's defaults: no sequence or iteration time": deepspeed})
    rows, refused = convert_records(cases.to_dict("records"), spec_of, _row)
    return rows, reasons + refused


def _row(spec: RunSpec, r: dict, i: int) -> dict:
    if r["unit"] != "ms":
        raise ValueError(f"iteration_time in {r['unit']!r}, expected ms")
    return {
        **spec_columns(spec, f"dlperf{i}", "dlperf-v100", PRESET),
        "status": "ok",
        "error": "",
        "iter_time_s": r["measured_value"] / 1000,
        "peak_mem_bytes": None,  # nvidia-smi's reading is not the allocator's peak
        "source": r["source"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default="data/external/published/dlperf_megatron_v100.csv")
    parser.add_argument("--out", default="data/runs/dlperf-v100.parquet")
    args = parser.parse_args()
    df, reasons = convert(args.src)
    save(df, reasons, args.out, f"{len(df)} Megatron-LM cases on V100")


if __name__ == "__main__":
    main()
