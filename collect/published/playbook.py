"""The Ultra-Scale Playbook's H100 runs (Nanotron, Llama-shaped models on 1 to 32 nodes) as rows of data/runs.

    python -m collect.published.playbook [--src data/external/playbook/h100_nanotron.csv]
                                         [--out data/runs/playbook-h100.parquet] [--tag playbook]

The 8B model's runs, published later in a file of their own, are converted with
``--src data/external/playbook/h100_nanotron_8b.csv --out data/runs/playbook-h100-8b.parquet --tag playbook8b``.

Source: Hugging Face, "The Ultra-Scale Playbook: Training LLMs on GPU Clusters" (2025), its interactive
benchmark figure (mirror github.com/vinjn/nanotron-ultrascale-playbook, commit 924e4d0), as converted in
data/external/playbook (SOURCE.md, copied from ../shared/data/playbook). What the source states is filled in
as stated; the model shapes are that conversion's inference (one corrected: HEADS). What the figure does not
print is read from the script that generated its runs, nanotron scripts/scaling_benchmarks.py (github.com/
huggingface/nanotron, "used in https://huggingface.co/spaces/nanotron/ultrascale-playbook"), and its base config
examples/config_tiny_llama_bench.yaml: tp_mode REDUCE_SCATTER (sequence parallelism), accumulate_grad_in_fp32
(fp32 gradients, beside Nanotron's fp32 master weights), pp_engine 1f1b, no recompute_layer (no recompute).
Nanotron's benchmark logger writes memory (peak allocated, and peak reserved) in units of 1024**3 bytes under
"GB" (src/nanotron/helpers.py, create_table_log), so the figure's GB are read as GiB; which of the two it plots
is not stated, and the rows are compared with the predicted peak allocated. Only global rank 0 writes the row
(log_throughput), with its own peak: the first pipeline stage's, which Nanotron's split by weights gives the most
layers; the rows say so (peak_mem_pp_rank 0). A run without a result ("crashed/oom" in the figure) is kept with
status "failed": it did not run, for a reason the source does not give. Rows the plan schema cannot express are
left out and counted, with the reason.
"""

from __future__ import annotations

import argparse
from collections import Counter

import pandas as pd

from collect.published.rows import convert_records, save, spec_columns
from collect.schema import RunSpec, framework_conventions

PRESET = "h100-80gb"
SOURCE = "Ultra-Scale Playbook h100_nanotron.csv (Nanotron, H100 80GB nodes of 8)"
SHARDING = {0: "none", 1: "zero1"}  # Nanotron's ZeRO stage: 0 plain data parallel, 1 optimizer state over dp
MEMORY_BYTES = 80 * 2**30  # H100 80GB: 80 GiB of HBM3, as the h100-80gb preset
GIB = 2**30  # the figure's "GB": Nanotron's logger divides bytes by 1024**3
# SOURCE.md infers the 3B model's heads from Llama 3.2 3B (24), but 120 of its finished runs use tp 16 or 32, and
# Nanotron needs the heads to divide over tp: 32 heads of 96 is the smallest reading they allow. With kv_heads =
# heads the head count changes no FLOP, parameter or activation byte, only which tp the schema accepts.
HEADS = {"3B": 32}
# SOURCE.md infers Llama 3's 128,256-token vocabulary. The script that generated the runs sets 131,072
# (scaling_benchmarks.py: VOCAB_SIZES, and check_params counts the models with it), which reproduces the printed
# counts as well (1.34, 3.57, 80 billion). Nanotron's split of a pipeline by weights weighs the head by it.
VOCAB = 131072


def spec_of(row: dict) -> RunSpec:
    """The plan a row describes; raises pydantic's ValidationError, naming the fields, if it cannot be one."""
    heads = HEADS.get(row["model"], row["heads"])
    workload = {
        "family": "llama",
        **{k: row[k] for k in ("layers", "hidden", "ffn_hidden", "seq_len", "dtype")},
        "vocab": VOCAB,
        "heads": heads,
        "kv_heads": heads if row["kv_heads"] == row["heads"] else row["kv_heads"],
        "tied_embeddings": bool(row["tied_embeddings"]),
        "micro_batch_size": row["micro_batch_size"],
        "global_batch_size": row["global_batch_size"],
    }
    plan = {
        "dp": row["dp"],
        "tp": row["tp"],
        "pp": row["pp"],
        "sharding": SHARDING[row["zero_stage"]],
        "num_microbatches": row["grad_acc"],
        "recompute": "none",
        "sequence_parallel": row["tp"] > 1,  # tp_mode REDUCE_SCATTER
        **framework_conventions("nanotron", row["tp"], row["tp"] > 1, row["dtype"]),
    }
    cluster = {
        "nodes": row["nodes"],
        "devices_per_node": row["devices_per_node"],
        "device": "cuda",
        "device_kind": "h100",
        "backend": "nccl",
        "memory_bytes": MEMORY_BYTES,
    }
    return RunSpec.model_validate({"workload": workload, "plan": plan, "cluster": cluster})


def convert(src: str, tag: str = "playbook") -> tuple[pd.DataFrame, Counter]:
    """(rows, reasons): the expressible rows in the row schema, and why the others could not be expressed.
    ``tag`` names each row's measurement (tag + its line), distinct per source file."""
    return convert_records(pd.read_csv(src).to_dict("records"), spec_of, lambda spec, r, i: _row(spec, r, f"{tag}{i}"))


def _row(spec: RunSpec, r: dict, measurement: str) -> dict:
    ok = r["status"] == "ok"
    return {
        **spec_columns(spec, measurement, "playbook-h100", PRESET),
        "status": "ok" if ok else "failed",
        "error": "" if ok else "no result in the source (out of memory or crashed; it does not say which)",
        "iter_time_s": r["iter_time_s"] if ok else None,
        "peak_mem_bytes": r["gpu_memory_gb"] * GIB if ok else None,
        "peak_mem_pp_rank": 0,  # rank 0 logs its own peak: the first pipeline stage's
        "source": SOURCE,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default="data/external/playbook/h100_nanotron.csv")
    parser.add_argument("--out", default="data/runs/playbook-h100.parquet")
    parser.add_argument("--tag", default="playbook", help="prefix of each row's measurement id, one per file")
    args = parser.parse_args()
    df, reasons = convert(args.src, args.tag)
    save(
        df,
        reasons,
        args.out,
        f"{len(df)} rows ({(df.status == 'ok').sum()} ok, {(df.status == 'failed').sum()} failed)",
    )


if __name__ == "__main__":
    main()
