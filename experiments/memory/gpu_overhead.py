"""Real GPU peaks against the fake-tensor trace of the same plans, and what the GPU adds on top of them.

    python -m experiments.memory.gpu_peaks --fake-cpu data/memory/h100-single-gpu.jsonl

Two sets of real single-GPU peaks of the collector's own code: the H100 rows of experiments.memory.gpu_peaks
(max allocated, max reserved, the device's used memory) and the H200 sweep gpu-h200-v1 (max allocated). Each plan
is traced on the CPU under fake tensors (collect.fake.trace, one process per plan, resumable in
experiments/results/gpu_vs_fake.jsonl); the summary, experiments/results/gpu_vs_fake.json, gives
- how far the trace is from torch.cuda.max_memory_allocated (the CPU's attention kernels stand in for the GPU's);
- the caching allocator's reserved bytes over its allocated peak, with and without expandable segments;
- what the process holds outside PyTorch's allocator (CUDA's context, NCCL's and cuBLAS's own buffers).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from collect import REPO
from collect.store import ResultStore
from gnn.dataset.rows import row_to_spec

RESULTS = REPO / "experiments" / "results"
JOURNAL = RESULTS / "gpu_vs_fake.jsonl"
H200_SWEEP = REPO / "data" / "runs" / "gpu-h200-v1.parquet"


def compare(h100_rows: Path) -> dict:
    plans = _h100_plans(h100_rows) + _h200_plans()
    traced = _traced(plans)
    frame = pd.DataFrame([{**p, **traced[p["spec"]]} for p in plans if p["spec"] in traced])
    summary = summarise(frame)
    (RESULTS / "gpu_vs_fake.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return summary


def _h100_plans(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "max_allocated" not in row:
            continue
        out.append({
            "set": "h100", "key": row["key"], "spec": json.dumps(row["spec"], sort_keys=True), "oom": row["oom"],
            "alloc_conf": row["alloc_conf"], "allocated": row["max_allocated"], "reserved": row["max_reserved"],
            "outside": row["device_used"] - row["reserved_now"], "context": row["context_bytes"],
            "total": row["total_bytes"],
        })  # fmt: skip
    return out


def _h200_plans() -> list[dict]:
    rows = ResultStore(H200_SWEEP).load()
    rows = rows[rows["status"] == "ok"].drop_duplicates("run_id")
    out = []
    for _, row in rows.iterrows():
        spec, _, _ = row_to_spec(row)
        spec_json = json.dumps(json.loads(spec.model_dump_json()), sort_keys=True)
        out.append({"set": "h200", "key": row["run_id"], "spec": spec_json, "oom": False, "alloc_conf": "",
                    "allocated": int(row["peak_mem_bytes"])})  # fmt: skip
    return out


def _traced(plans: list[dict]) -> dict[str, dict]:
    """Each distinct plan's fake trace on the CPU, from the journal or traced now (and journalled)."""
    done = {}
    if JOURNAL.exists():
        for line in JOURNAL.read_text().splitlines():
            entry = json.loads(line)
            done[entry["spec"]] = entry
    todo = sorted({p["spec"] for p in plans} - set(done))
    for spec in tqdm(todo, desc="fake traces", unit="plan"):
        proc = subprocess.run([sys.executable, "-m", "collect.fake.trace", spec], capture_output=True, text=True)
        result = json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr[-400:]}
        entry = {"spec": spec, **{("fake" if k == "peak_mem_bytes" else k): v for k, v in result.items()}}
        with JOURNAL.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        done[spec] = entry
    return done


def summarise(frame: pd.DataFrame) -> dict:
    fits = frame[~frame["oom"] & frame["fake"].notna()]
    err = (fits["fake"] / fits["allocated"] - 1) * 100
    out = {"plans": int(len(frame)), "traced": int(frame["fake"].notna().sum())}
    for name, part in err.groupby(fits["set"]):
        out[f"fake_vs_max_allocated_{name}_pct"] = _stats(part)
    out["worst"] = (
        fits.assign(err_pct=err).loc[err.abs().nlargest(5).index, ["set", "key", "err_pct"]].to_dict("records")
    )
    h100 = fits[fits["set"] == "h100"]
    for conf, part in h100.groupby("alloc_conf"):
        gap = (part["reserved"] / part["allocated"] - 1) * 100
        out[f"reserved_over_allocated_pct[{conf or 'default'}]"] = _stats(gap)
    out["outside_allocator_mib"] = _stats(h100["outside"] / 2**20)
    out["context_mib"] = _stats(h100["context"] / 2**20)
    ooms = frame[frame["oom"]]
    out["oom_plans"] = [
        {"key": r["key"], "fake_gib": r["fake"] / 2**30, "usable_gib": (r["total"] - r["outside"]) / 2**30}
        for _, r in ooms.iterrows()
    ]
    return out


def _stats(values) -> dict:
    v = np.asarray(values, dtype=float)
    a = np.abs(v)
    return {"n": int(len(v)), "median": float(np.median(v)), "median_abs": float(np.median(a)),
            "p90_abs": float(np.quantile(a, 0.9)), "max_abs": float(a.max()), "min": float(v.min()),
            "max": float(v.max())}  # fmt: skip
