"""Megatron-Bridge's published mixture-of-experts pre-training throughput as rows of data/runs.

    python -m collect.published.moe [--src data/external/published/megatron_bridge_perf_summary_moe.csv]
                                    [--out data/runs/published-moe.parquet]

Source (data/external/published/megatron_bridge_perf_summary_moe.SOURCE.md, copied from ../shared/data/published):
NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md and performance-summary-archive.md at commit 067f987,
releases 25.09 to 26.08: 194 printed configurations of DeepSeek-V3, DeepSeek-V4 Flash, GPT-OSS-120B, Qwen3-30B-A3B,
Qwen3-235B-A22B, Kimi-K2 and Nemotron-3 on DGX H100, B200, B300 and GB200 / GB300 NVL72. Each prints tokens/s per
GPU; the iteration time is global batch x sequence / (tokens/s per GPU x GPUs) (the table's step_time_s). No
memory is printed.

What is filled in beyond the table, and why:
- the architecture, from the model's public Hugging Face config (experiments/requests/hf, HF_CONFIGS below; the
  table prints none);
- Megatron-Bridge's MoE performance recipes at the same commit (src/megatron/bridge/perf_recipes/): experts whole
  on each rank (expert_tensor_parallel_size 1), the distributed optimizer (zero1), gradients reduced in bf16
  (grad_reduce_in_fp32 False), DeepSeek-V3's AdamW moments in bf16 (its precision-aware optimizer), each recipe's
  token dispatcher (HYBRID_DISPATCH: the recipes at this commit, taken for every release), and Megatron's
  conventions otherwise (collect.schema.framework_conventions); sequence parallelism with tp; interleaved 1F1B
  where VP is printed above 1;
- precisions: BF16 none; FP8 and FP8-CS (Transformer Engine's current scaling, per tensor) tensorwise; MXFP8 and
  FP8-MX (the same recipe, MXFP8BlockScaling) mxfp8; NVFP4 nvfp4;
- routing as the pages ran it: force-balanced and dropless (expert_imbalance 1.0); the 25.09 "(tokendrop)" rows
  drop at a capacity their balanced routing never reaches, so they are the same plan.
Left out, counted with the reason: hybrid Mamba-Transformer models (Nemotron-3), rows without a printed precision
(release 25.09) and a model whose config no family reads (DeepSeek-V4 Flash). Approximated, and said here:
DeepSeek-V3's multi-token prediction layer, on in its recipes, is not in the workload; Kimi-K2's recipe trains with
Muon and no distributed optimizer (sharding none), and its optimizer step is priced as AdamW's (Muon's
Newton-Schulz iterations, about 5 x 4 m^2 n FLOPs per m x n weight, are about 1% of its step on 256 GPUs).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from collect import REPO
from collect.hardware.records import load_hardware
from collect.published.rows import SWEEP_PREFIX, convert_records, save, spec_columns
from collect.schema import RunSpec, Workload, framework_conventions
from collect.schema.hf import HFConfigError, hf_fields

HF = REPO / "experiments" / "requests" / "hf"
# the printed model -> its config in experiments/requests/hf (experiments/requests/hf/SOURCES.md)
HF_CONFIGS = {
    "DeepSeekV3": "deepseek-v3",
    "DeepSeekV4 Flash": "deepseek-v4-flash",
    "GPT OSS 120B": "gpt-oss-120b",
    "Qwen3_30B_a3B": "qwen3-30b-a3b",
    "Qwen3_235B_a22B": "qwen3-235b-a22b",
    "Kimi_K2": "kimi-k2",
}
# printed GPU -> (preset, GPUs per NVLink domain); an NVL72 job is taken to use a power-of-two share of a rack, at
# most 64 GPUs, the largest that divides its GPU count (collect.published.nemo's assumption)
GPUS = {
    "DGX-H100": ("h100-80gb", 8),
    "DGX-B200": ("b200-180gb", 8),
    "DGX-B300": ("b300-288gb", 8),
    "DGX-GB200": ("gb200-nvl72", 64),
    "DGX-GB300": ("gb300-nvl72", 64),
}
# the token dispatcher of each recipe (Megatron-Bridge perf_recipes at 067f987, taken for every release): the flex
# dispatcher with HybridEP or DeepEP (plan.moe_dispatcher "hybrid") or the alltoall one, by model, then by GPU and
# precision where a model's recipes differ
HYBRID_DISPATCH = {
    "DeepSeekV3": lambda gpu, precision: True,
    "Qwen3_30B_a3B": lambda gpu, precision: True,
    "Qwen3_235B_a22B": lambda gpu, precision: gpu != "DGX-H100" and (gpu != "DGX-B200" or precision == "MXFP8"),
    "GPT OSS 120B": lambda gpu, precision: gpu == "DGX-B300" or (gpu.startswith("DGX-GB") and precision == "MXFP8"),
    "Kimi_K2": lambda gpu, precision: gpu.startswith("DGX-GB"),
}
FLOAT8 = {"BF16": "none", "FP8": "tensorwise", "FP8-CS": "tensorwise", "MXFP8": "mxfp8", "FP8-MX": "mxfp8"}
FLOAT8 |= {"NVFP4": "nvfp4"}
SWEEP = f"{SWEEP_PREFIX}moe"


def spec_of(row: dict) -> RunSpec:
    """The plan a printed configuration describes; ValueError (naming what) when the schema cannot hold it."""
    if row["family"] == "hybrid-mamba-moe":
        raise ValueError("hybrid Mamba-Transformer layers (Nemotron-3) are not in the llama/moe families")
    precision = row["precision"]
    if not isinstance(precision, str):
        raise ValueError("precision not printed (release 25.09's tables have no precision column)")
    tp, pp, dp, ep, mbs = (int(row[k]) for k in ("tp", "pp", "dp", "ep", "micro_batch"))
    gbs, vp = int(row["global_batch"]), row["vp"]
    interleaved = isinstance(vp, float) and not math.isnan(vp) and vp > 1
    config = json.loads((HF / f"{HF_CONFIGS[row['model']]}.config.json").read_text())
    try:
        hf_fields(config, int(row["seq_len"]))
    except HFConfigError as e:  # the reader's reason, without the config field it names (before the colon)
        raise ValueError(f"model {row['model']} is not in the families ({str(e).split(': ', 1)[-1]})") from e
    workload = Workload.from_hf_config(
        config, seq_len=int(row["seq_len"]), micro_batch_size=mbs, global_batch_size=gbs, float8=FLOAT8[precision]
    )
    plan = {
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "ep": ep,
        "etp": 1,
        "sharding": "zero1",
        "num_microbatches": gbs // (mbs * dp),
        "virtual_stages": int(vp) if interleaved else 1,
        "sequence_parallel": tp > 1,
        **framework_conventions("nemo", tp, tp > 1, "bfloat16", workload.float8),
        "fp32_grads": False,  # the perf recipes' grad_reduce_in_fp32 False
        "moe_dispatcher": "hybrid" if HYBRID_DISPATCH[row["model"]](row["gpu_type"], precision) else "alltoall",
    }
    if row["model"] == "DeepSeekV3":
        plan["optimizer_state_dtype"] = "bfloat16"
    if row["model"] == "Kimi_K2":  # its recipe: Muon without the distributed optimizer
        plan["sharding"] = "none"
        plan["param_gather_overlap"] = False
    if pp > 1:
        plan["pp_schedule"] = "interleaved_1f1b" if interleaved else "1f1b"
    preset, domain = GPUS[row["gpu_type"]]
    gpus = int(row["gpus"])
    per_node = math.gcd(gpus, domain)
    record = load_hardware(preset)
    cluster = {"nodes": gpus // per_node, "devices_per_node": per_node, "device": "cuda", "backend": "nccl"}
    cluster |= {"device_kind": record["device_kind"], "memory_bytes": record["memory_bytes"]}
    return RunSpec.model_validate({"workload": workload.model_dump(), "plan": plan, "cluster": cluster})


def _row(spec: RunSpec, r: dict, i: int) -> dict:
    return {
        **spec_columns(spec, f"{SWEEP}{i}", SWEEP, GPUS[r["gpu_type"]][0]),
        "status": "ok",
        "error": "",
        "iter_time_s": float(r["step_time_s"]),
        "peak_mem_bytes": None,  # not printed
        "source": f"{r['source']} ({r['release']}, {r['value_variant']})",
        "recompute": None,  # not printed
        "model": HF_CONFIGS[r["model"]],  # the architecture, for the held-out model splits (gnn.dataset.splits)
    }


def convert(src: Path) -> tuple[pd.DataFrame, dict]:
    return convert_records(pd.read_csv(src).to_dict("records"), spec_of, _row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default="data/external/published/megatron_bridge_perf_summary_moe.csv")
    parser.add_argument("--out", default=f"data/runs/{SWEEP}.parquet")
    args = parser.parse_args()
    df, reasons = convert(Path(args.src))
    kinds = ", ".join(f"{n} on {k}" for k, n in df["device_kind"].value_counts().items())
    save(df, reasons, args.out, f"{len(df)} ({kinds})")


if __name__ == "__main__":
    main()
