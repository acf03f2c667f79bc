"""NVIDIA's published pre-training throughput (NeMo 24.07 and Megatron-Bridge) as rows of data/runs.

    python -m collect.published.nemo [--src-dir data/external/published] [--out-dir data/runs]

writes published-h100.parquet (DGX H100) and published-blackwell.parquet (DGX B200, GB200 and GB300 NVL72).

Sources (data/external/published/SOURCES.md, copied from ../shared/data/published): NVIDIA/NeMo
docs/source/performance/performance_summary.md at three revisions of the 24.07 release, and NVIDIA-NeMo/
Megatron-Bridge docs/performance-summary-archive.md (releases 25.09 to 26.06). Each configuration prints
tokens/s per GPU; its iteration time is global batch x sequence / (tokens/s per GPU x GPUs). No memory is printed.
Each GPU is a datasheet preset (GPUS below); on a GB200 or GB300 NVL72 a node is the NVLink domain.

What is filled in beyond the tables, and why:
- shapes the tables leave out (FFN width, key/value heads, vocabulary) from the models' published configurations
  (ARCH below);
- Megatron's conventions, which NeMo runs by default: the distributed optimizer (zero1) unless the row says
  Megatron-FSDP (fsdp_full), sequence parallelism with tp, vocabulary-parallel loss, a pipeline that keeps only the
  loss and frees its buffers, fp32 master weights and gradients (NeMo's bf16_mixed: grad_reduce_in_fp32=True),
  interleaved 1F1B where the row prints VP;
- FP8 ("FP8", "FP8-CS": per-tensor scaling) as float8 tensorwise, "MXFP8" and "FP8-MX" as mxfp8, "NVFP4" as
  nvfp4; recompute is not printed (left empty).
Left out, counted with the reason: fine-tuning (SFT, LoRA), rows without a printed precision, and models no family
expresses (Nemotron: GQA with a squared-ReLU MLP).
"""

from __future__ import annotations

import argparse
import math
import re
from collections import Counter
from pathlib import Path

import pandas as pd

from collect.hardware.records import load_hardware
from collect.published.rows import convert_records, save, spec_columns
from collect.schema import RunSpec, framework_conventions

TABLES = ("nemo_24.07_perf_summary_h100.csv", "megatron_bridge_perf_summary_dense.csv")
# printed GPU -> (preset, device kind, GPUs per NVLink domain, output file). An NVL72 rack joins 72 GPUs over
# NVLink; a job is taken to use a power-of-two share of one, at most 64 GPUs, the largest that divides its GPU
# count: an assumption, as the tables do not print how a job sits on the racks.
GPUS = {
    "H100": ("h100-80gb", "h100", 8, "published-h100"),
    "DGX-B200": ("b200-180gb", "b200", 8, "published-blackwell"),
    "DGX-GB200": ("gb200-nvl72", "gb200", 64, "published-blackwell"),
    "DGX-GB300": ("gb300-nvl72", "gb300", 64, "published-blackwell"),
}
# (family, ffn_hidden, kv_heads, vocab): Llama 2 (Touvron et al. 2023, table and released configs: 32,000
# tokens, GQA only at 70B), Llama 3 / 3.1 (Meta's released config.json files: 128,256 tokens, 8 kv heads),
# GPT-3 as NeMo configures it (4h MLP, full attention, GPT-2's 50,257-token BPE padded to 50,304 as Megatron's
# make-vocab-size-divisible-by 128 pads it)
ARCH = {
    "LLAMA2-7B": ("llama", 11008, 32, 32000),
    "LLAMA2-13B": ("llama", 13824, 40, 32000),
    "LLAMA2-70B": ("llama", 28672, 8, 32000),
    "LLAMA3-8B": ("llama", 14336, 8, 128256),
    "LLAMA3_8B": ("llama", 14336, 8, 128256),
    "LLAMA3-70B": ("llama", 28672, 8, 128256),
    "LLAMA3_70B": ("llama", 28672, 8, 128256),
    "LLAMA3.1_405B": ("llama", 53248, 8, 128256),
    "GPT3-5B": ("gpt", None, None, 50304),
    "GPT3-20B": ("gpt", None, None, 50304),
    "GPT3-175B": ("gpt", None, None, 50304),
}
# FP8 and FP8-CS: per-tensor current scaling; MXFP8 and FP8-MX (its older name): Transformer Engine's
# MXFP8BlockScaling; NVFP4: NVFP4BlockScaling (Megatron-Bridge's perf_recipes/_common.py at commit 067f987)
FLOAT8 = {"FP8": "tensorwise", "FP8-CS": "tensorwise", "BF16": "none", "MXFP8": "mxfp8", "FP8-MX": "mxfp8"}
FLOAT8 |= {"NVFP4": "nvfp4"}
CONFIG = ["source", "model", "layers", "hidden", "heads", "seq_len", "global_batch", "micro_batch", "gpus"]
CONFIG += ["gpu_type", "tp", "pp", "dp", "cp", "zero_stage", "schedule", "notes"]


def configurations(src_dir: Path) -> pd.DataFrame:
    """One row per printed configuration (the tables are long: one row per metric), with its tokens/s per GPU."""
    frames = [pd.read_csv(src_dir / name, dtype={"zero_stage": str, "schedule": str}) for name in TABLES]
    long = pd.concat(frames, ignore_index=True)
    wide = long[long["measured_metric_name"] == "tokens_per_sec_per_gpu"].copy()
    return wide.rename(columns={"measured_value": "tokens_per_s_per_gpu"}).reset_index(drop=True)


def spec_of(row: dict) -> RunSpec:
    """The plan a printed configuration describes; ValueError (naming what) when the schema cannot hold it."""
    gpu = _gpu(row["gpu_type"])
    if not ("pretraining" in row["notes"] or "Pre-Training" in row["notes"]):
        raise ValueError("fine-tuning (SFT or LoRA), not pre-training")
    precision = _precision(row["notes"])
    if precision not in FLOAT8:
        raise ValueError(
            f"precision {precision or 'not printed'} has no float8 setting" if precision else "precision not printed"
        )
    if row["model"] not in ARCH:
        raise ValueError(f"model {row['model']} fits no family")
    family, ffn, kv_heads, vocab = ARCH[row["model"]]
    tp, pp, dp, cp, mbs = (int(row[k]) for k in ("tp", "pp", "dp", "cp", "micro_batch"))
    vp = re.search(r"VP=(\d+)", str(row["schedule"]))
    workload = {
        "family": family,
        "layers": int(row["layers"]),
        "hidden": int(row["hidden"]),
        "heads": int(row["heads"]),
        "vocab": vocab,
        "seq_len": int(row["seq_len"]),
        "dtype": "bfloat16",
        "float8": FLOAT8[precision],
        "micro_batch_size": mbs,
        "global_batch_size": int(row["global_batch"]),
    }
    if family == "llama":
        workload |= {"ffn_hidden": ffn, "kv_heads": kv_heads, "tied_embeddings": False}
    plan = {
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "sharding": "fsdp_full" if "FSDP=" in str(row["zero_stage"]) else "zero1",
        "num_microbatches": int(row["global_batch"]) // (mbs * dp),
        "virtual_stages": int(vp.group(1)) if vp else 1,
        "sequence_parallel": tp > 1,
        # Megatron's conventions (collect.schema.framework_conventions); NeMo's bf16_mixed sets grad_reduce_in_fp32
        **framework_conventions("nemo", tp, tp > 1, workload["dtype"], workload["float8"]),
    }
    if pp > 1:
        plan["pp_schedule"] = "interleaved_1f1b" if vp else "1f1b"
    preset, kind, domain, _ = GPUS[gpu]
    gpus = int(row["gpus"])
    per_node = math.gcd(gpus, domain)
    cluster = {"nodes": gpus // per_node, "devices_per_node": per_node, "device": "cuda", "device_kind": kind}
    cluster |= {"backend": "nccl", "memory_bytes": load_hardware(preset)["memory_bytes"]}
    return RunSpec.model_validate({"workload": workload, "plan": plan, "cluster": cluster})


def _gpu(printed: str) -> str:
    gpu = next((g for g in GPUS if g in printed), None)
    if gpu is None:
        raise ValueError(f"GPU {printed} has no preset")
    return gpu


def _precision(notes: str) -> str | None:
    found = re.search(r"(?:precision |; )(FP8-CS|FP8-MX|MXFP8|NVFP4|FP8|BF16)\b", notes)
    return found.group(1) if found else None


def convert(src_dir: Path) -> tuple[pd.DataFrame, Counter]:
    """(rows, reasons): the expressible configurations in the row schema, and why the others could not be."""
    return convert_records(configurations(src_dir).to_dict("records"), spec_of, _row)


def _row(spec: RunSpec, r: dict, i: int) -> dict:
    w, c = spec.workload, spec.cluster
    preset, _, _, sweep = GPUS[_gpu(r["gpu_type"])]
    return {
        **spec_columns(spec, f"published{i}", sweep, preset),
        "status": "ok",
        "error": "",
        "iter_time_s": w.global_batch_size * w.seq_len / (r["tokens_per_s_per_gpu"] * c.world_size),
        "peak_mem_bytes": None,  # not printed
        "source": r["source"],
        "recompute": None,  # not printed
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src-dir", default="data/external/published")
    parser.add_argument("--out-dir", default="data/runs")
    args = parser.parse_args()
    df, reasons = convert(Path(args.src_dir))
    for i, (sweep, rows) in enumerate(df.groupby("sweep_id")):
        kinds = ", ".join(f"{n} on {k}" for k, n in rows["device_kind"].value_counts().items())
        said = reasons if i == 0 else Counter()  # what could not be expressed, said once for both files
        save(rows, said, f"{args.out_dir}/{sweep}.parquet", f"{len(rows)} ({kinds})")


if __name__ == "__main__":
    main()
