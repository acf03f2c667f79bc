"""Bring vTrain's 1,440 real A100 measurements into plansight's row schema.

    python -m collect.published.vtrain [--src data/external/vtrain/ground_truth_single.csv]
        [--out data/runs/vtrain-a100.parquet]

Source: VIA Research Group (KAIST), vTrain (MICRO 2024), data/ground_truth_single.csv
at commit f8dda84, Megatron-DeepSpeed on one A100 node; see data/external/vtrain/.
Only what the source states is filled in. Its validation configs state
activation checkpointing on and the 1F1B schedule; vocabulary, dtype, ZeRO
stage, GPU memory size and peak memory are not stated and stay empty.
"""

from __future__ import annotations

import argparse
import hashlib

import pandas as pd

PRESET = "a100-80gb"  # A100 compute and NVLink figures are the same for the 40 and 80 GB parts
COLUMNS = {
    "# GPUs": "world_size",
    "global batch": "global_batch_size",
    "micro batch": "micro_batch_size",
    "hidden size": "hidden",
    "attention heads": "heads",
    "# layers": "layers",
    "sequence length": "seq_len",
    "tensor parallelism": "tp",
    "data parallelism": "dp",
    "pipeline parallelism": "pp",
}


def convert(src: str) -> pd.DataFrame:
    raw = pd.read_csv(src, encoding="utf-8-sig")
    raw.columns = [c.strip() for c in raw.columns]
    df = raw.rename(columns=COLUMNS)
    df["iter_time_s"] = raw["iteration time (ms)"] / 1e3
    df = df.drop(columns=["iteration time (ms)"])
    df["num_microbatches"] = df["global_batch_size"] // (df["dp"] * df["micro_batch_size"])
    df["run_id"] = [
        hashlib.sha256(",".join(map(str, r)).encode()).hexdigest()[:16] for r in raw.itertuples(index=False)
    ]
    df["measurement_id"] = [f"{rid}-row{i}" for i, rid in enumerate(df["run_id"])]
    df["repeat_group"] = df["run_id"].where(df["run_id"].duplicated(keep=False))
    stated = {
        "sweep_id": "vtrain-a100-single",
        "fingerprint_id": PRESET,
        "status": "ok",
        "error": "",
        "family": "gpt",
        "recompute": "full",
        "virtual_stages": 1,
        "sequence_parallel": False,
        "nodes": 1,
        "device": "cuda",
        "device_kind": "a100",
        "backend": "nccl",
        "is_reference": False,
        "source": "vTrain ground_truth_single.csv (Megatron-DeepSpeed, A100 node)",
    }
    for column, value in stated.items():
        df[column] = value
    df["devices_per_node"] = df["world_size"]
    df["pp_schedule"] = df["pp"].map(lambda pp: "1f1b" if pp > 1 else None)
    for unknown in (
        "vocab",
        "dtype",
        "sharding",
        "memory_bytes",
        "peak_mem_bytes",
        "collected_at",
        "iter_time_p10_s",
        "iter_time_p90_s",
        "ref_time_s",
    ):
        df[unknown] = None
    return df


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default="data/external/vtrain/ground_truth_single.csv")
    parser.add_argument("--out", default="data/runs/vtrain-a100.parquet")
    args = parser.parse_args()
    df = convert(args.src)
    df.to_parquet(args.out, compression="zstd", index=False)
    print(f"{args.out}: {len(df)} rows, world sizes {sorted(df.world_size.unique())}")


if __name__ == "__main__":
    main()
