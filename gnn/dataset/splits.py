"""Named, deterministic train / validation / test splits that test generalisation.

Rows of one plan (repeats) always fall on the same side: assignment hashes the
run id. Test sets: random 15%; the largest model shape; the largest world
size; whole strategy families (interleaved 1F1B, full FSDP); the moe model
family (trained on gpt and llama only); each sitting of the CPU machine's fixed plan set (trained on the others);
on the A100 rows, the largest hidden size, the largest layer counts and
the largest scale; on other GPUs (H100), the largest model and the largest world size; a GPU never trained on
(NVIDIA's published Blackwell runs and DLPerf's V100 runs, each GPU a split of its own, from a model trained on
NVIDIA's published runs on H100 and the other Blackwell GPUs, and on the A100 rows for V100); over NVIDIA's
published runs, each MoE architecture and the block-scaled precisions (workload_splits). Validation is a 15%
hash-slice of what is not test.
``all/random`` is the union of the domains' random splits: the served model (the champion) is trained on it, so
one model predicts CPU and GPU plans, and its test rows are exactly those of the domains' random splits.

The full-size fake traces (memory only, gnn.dataset.rows.fake_as_gpu_rows) are never a measured split's test:
they are trained on (and validated on) in every split of their GPU's rows and in ``all/random``, whose test holds
a random 15% of them too; ``fake/held_out_model-<name>`` tests the served model's memory on the traces of each
family's largest model, trained on ``all/random`` and every other model's traces: a model size it never saw.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from collect.published.moe import SWEEP as MOE_SWEEP  # one published MoE architecture per ``model``
from collect.published.rows import SWEEP_PREFIX

SERVING_SPLIT = "all/random"
FAKE = "fake"  # the calibration and scoring domain of the fake traces, whatever GPU they are planned on
# pipelined traces and the others are calibrated apart: the network's errors on pipelined ones are several times
# the others' (intervals calibrated on every trace held 38-59% of the pipelined ones, 85% of the rest); a part with too
# few validation rows takes FAKE's factor, fitted on every trace
FAKE_PARTS = {True: f"{FAKE}/pipelined", False: f"{FAKE}/unpipelined"}
# GPUs with a few dozen published runs and no sweep of their own: never trained on, each is the test of a split
# trained on the nearest GPU measured at scale, as a user of a GPU we have never measured would be served
UNMEASURED_GPUS = {"b200": "h100", "b300": "h100", "gb200": "h100", "gb300": "h100", "v100": "a100"}
# Blackwell GPUs are learned from NVIDIA's published runs on the other GPUs (H100 and the other Blackwell GPUs: the
# same framework's recipes), as a user of a new Blackwell part would be served: their MXFP8 and NVFP4 runs have no
# H100 counterpart. With 190 published rows between them they also have random splits, so the served model
# (all/random) learns from them.
BLACKWELL = ("b200", "b300", "gb200", "gb300")


def _unit(run_id: str, salt: str) -> float:
    return int(hashlib.sha256(f"{salt}:{run_id}".encode()).hexdigest()[:8], 16) / 2**32


def random_test(run_ids: pd.Series) -> pd.Series:
    """The random splits' test rows: 15% of runs, by a hash of the run id (stable as rows are added)."""
    return run_ids.map(lambda r: _unit(r, "test")) < 0.15


def _split(df: pd.DataFrame, test_mask: pd.Series, salt: str) -> dict[str, np.ndarray]:
    u = df["run_id"].map(lambda r: _unit(r, salt))
    val = ~test_mask & (u < 0.15)
    return {"train": np.flatnonzero(~test_mask & ~val), "val": np.flatnonzero(val), "test": np.flatnonzero(test_mask)}


def _gpu_tests(d: pd.DataFrame) -> dict[str, pd.Series]:
    """The largest model and the most GPUs, held out of the domain's main source (its most frequent: one framework
    and sweep, e.g. the playbook's Nanotron runs); the other sources' rows (e.g. NVIDIA's published NeMo and
    Megatron runs) are a split of their own, trained on the main source."""
    source = d["source"].fillna("") if "source" in d else pd.Series("", index=d.index)
    main = source == source.mode().iloc[0]
    tests = {
        "held_out_size": main & (d["num_params"] == d.loc[main, "num_params"].max()),
        "held_out_scale": main & (d["world_size"] == d.loc[main, "world_size"].max()),
    }
    if not main.all():
        tests["held_out_source"] = ~main
    return tests


SITTING_PREFIX = "cpu-sitting-"  # sweeps of collect/sweeps/cpu-sittings.yaml, one per sitting of the machine


def sitting_tests(d: pd.DataFrame) -> dict[str, pd.Series]:
    """``held_out_sitting-<tag>``: one sitting of the fixed plan set held out, trained on every other row (the same
    plans' other sittings among them): what a new sitting of a machine the model knows does to its times. Sweeps
    run back to back in one sitting (``<tag>``, ``<tag>2``: fresh processes, minutes apart) are held out together."""
    sweeps = d["sweep_id"].fillna("") if "sweep_id" in d else pd.Series("", index=d.index)
    tag = sweeps.str.removeprefix(SITTING_PREFIX).str.replace(r"\d+$", "", regex=True)
    tags = sorted(set(tag[sweeps.str.startswith(SITTING_PREFIX)]))
    return {f"held_out_sitting-{t}": sweeps.str.startswith(SITTING_PREFIX) & (tag == t) for t in tags}


def is_fake(meta: pd.DataFrame) -> pd.Series:
    """Rows of a fake-tensor trace (collect.fake), not a measured run."""
    return meta["peak_mem_method"].eq("fake") if "peak_mem_method" in meta else pd.Series(False, index=meta.index)


def scored_domain(rows: pd.DataFrame) -> pd.Series:
    """What a row is calibrated and scored under: its hardware domain, or "fake" for a fake-tensor trace (predicted
    as a plan of its GPU, never scored among that GPU's measured runs)."""
    return rows["domain"].astype(str).where(~is_fake(rows), FAKE)


def calibration_domain(rows: pd.DataFrame) -> pd.Series:
    """Whose interval factor a row takes (gnn.model.ensemble): its scored domain, a trace's refined by whether it is
    pipelined (fake_part)."""
    return scored_domain(rows).where(~is_fake(rows), fake_part(rows))


def fake_part(rows: pd.DataFrame) -> pd.Series:
    """The calibration domain each row would take as a trace (FAKE_PARTS): a part falls back to its parent's factor
    (FAKE) where too few validation rows fitted one."""
    return rows["pp"].fillna(1).astype(int).gt(1).map(FAKE_PARTS)


def fake_model(rows: pd.DataFrame) -> pd.Series:
    """A traced model's name from its family and size in whole billions: llama-70b, moe-671b."""
    return rows["family"] + "-" + (rows["num_params"].astype(float) // 1e9).astype(int).astype(str) + "b"


def named_splits(meta: pd.DataFrame) -> dict[str, dict[str, np.ndarray]]:
    """{"cpu/random": {"train": idx, "val": idx, "test": idx}, ...}; indices into meta."""
    fake = is_fake(meta)
    splits = measured_splits(meta[~fake])
    if not fake.any():
        return splits
    traces = meta[fake]
    parts = {k: traces.index.to_numpy()[v] for k, v in _split(traces, random_test(traces["run_id"]), FAKE).items()}
    learned = {"train": np.concatenate([parts["train"], parts["test"]]), "val": parts["val"]}
    gpus = set(traces["domain"].astype(str))
    for name, split in splits.items():
        if name == SERVING_SPLIT or name.split("/", 1)[0] in gpus:
            own = parts if name == SERVING_SPLIT else {**learned, "test": np.array([], dtype=int)}
            splits[name] = {k: np.sort(np.concatenate([split[k], own[k]])) for k in ("train", "val", "test")}
    serving, models = splits[SERVING_SPLIT], fake_model(traces)
    largest = traces.groupby("family")["num_params"].transform("max") == traces["num_params"]
    for model in sorted(models[largest].unique()):
        held = models.index[models == model].to_numpy()
        splits[f"fake/held_out_model-{model}"] = {
            "train": np.setdiff1d(np.concatenate([serving["train"], parts["test"]]), held),
            "val": np.setdiff1d(serving["val"], held),
            "test": held,
        }
    return splits


def measured_splits(meta: pd.DataFrame) -> dict[str, dict[str, np.ndarray]]:
    """The splits of the measured runs (no fake trace among ``meta``'s rows)."""
    splits = {}
    for domain, df in meta.groupby("domain"):
        if domain in UNMEASURED_GPUS:
            splits |= _held_out_gpu(meta, domain)
            if domain not in BLACKWELL:
                continue
        rows = df.index.to_numpy()
        d = df.reset_index(drop=True)
        tests = {"random": random_test(d["run_id"])}
        if domain in BLACKWELL:  # their random split only: the served model learns from their other rows
            pass
        elif domain == "cpu":
            tests["held_out_shape"] = d["num_params"] == d["num_params"].max()
            tests["held_out_world_size"] = d["world_size"] == d["world_size"].max()
            tests["held_out_interleaved_1f1b"] = d["pp_schedule"] == "interleaved_1f1b"
            tests["held_out_fsdp_full"] = d["sharding"] == "fsdp_full"
            if d["family"].eq("moe").any():  # a family never seen in training: mixture-of-experts
                tests["held_out_moe"] = d["family"] == "moe"
            tests |= sitting_tests(d)
        elif domain == "a100":
            tests["held_out_hidden"] = d["hidden"] == d["hidden"].max()
            tests["held_out_layers"] = d["layers"] >= sorted(d["layers"].unique())[-2]
            tests["held_out_scale"] = d["world_size"] == d["world_size"].max()  # vTrain's 8-GPU runs
        else:  # what a GPU user asks of a predictor: a model size, a scale and a framework it has not seen
            tests |= _gpu_tests(d)
        for name, mask in tests.items():
            if mask.fillna(False).all():  # nothing left to train on (the H200's rows all run on one GPU): no split
                continue
            parts = _split(d, mask.fillna(False), name)
            splits[f"{domain}/{name}"] = {k: rows[v] for k, v in parts.items()}
    splits |= workload_splits(meta)
    randoms = [parts for name, parts in splits.items() if name.endswith("/random")]
    splits[SERVING_SPLIT] = {k: np.sort(np.concatenate([p[k] for p in randoms])) for k in ("train", "val", "test")}
    return splits


def _published(meta: pd.DataFrame) -> pd.Series:
    """NVIDIA's published NeMo and Megatron-Bridge runs (collect.published.nemo and .moe), on every GPU."""
    sweeps = meta["sweep_id"].fillna("") if "sweep_id" in meta else pd.Series("", index=meta.index)
    return sweeps.str.startswith(SWEEP_PREFIX) & (meta["domain"] != "cpu")


def workload_splits(meta: pd.DataFrame) -> dict[str, dict[str, np.ndarray]]:
    """The 2026 workload's splits over NVIDIA's published runs (one framework's recipes, dense and MoE, on H100
    and Blackwell): ``moe/held_out_model-<name>``, each published MoE architecture never trained on (trained on the
    others and every dense run); ``precision/held_out_nvfp4``, NVFP4 trained on MXFP8, FP8 and BF16;
    ``precision/held_out_mxfp8``, MXFP8 trained on FP8 and BF16 only (NVFP4 left out of its training: block-scaled
    too)."""
    gpu = meta[_published(meta)]
    float8 = gpu["float8"].fillna("none") if "float8" in gpu else pd.Series("none", index=gpu.index)
    tests = {}
    if "model" in gpu:
        moe = gpu["sweep_id"] == MOE_SWEEP
        for name in sorted(gpu.loc[moe, "model"].dropna().unique()):
            tests[f"moe/held_out_model-{name}"] = (moe & (gpu["model"] == name), None)
    block_scaled = float8.isin(["mxfp8", "nvfp4"])
    if (float8 == "nvfp4").any():
        tests["precision/held_out_nvfp4"] = (float8 == "nvfp4", None)
    if (float8 == "mxfp8").any():
        tests["precision/held_out_mxfp8"] = (float8 == "mxfp8", block_scaled & (float8 != "mxfp8"))
    splits = {}
    for name, (mask, excluded) in tests.items():
        d = gpu[~excluded] if excluded is not None else gpu
        parts = _split(d.reset_index(drop=True), mask[d.index].reset_index(drop=True), name)
        splits[name] = {k: d.index.to_numpy()[v] for k, v in parts.items()}
    return splits


def _held_out_gpu(meta: pd.DataFrame, gpu: str) -> dict[str, dict[str, np.ndarray]]:
    """``<gpu>/held_out_gpu``: tested on all of its own rows, trained on the nearest GPU measured at scale (A100
    for V100), or, for a Blackwell GPU, on NVIDIA's published runs on H100 and the other Blackwell GPUs."""
    if gpu in BLACKWELL:
        d = meta[_published(meta)]
    else:
        d = meta[meta["domain"].isin([gpu, UNMEASURED_GPUS[gpu]])]
    parts = _split(d.reset_index(drop=True), (d["domain"] == gpu).reset_index(drop=True), "held_out_gpu")
    return {f"{gpu}/held_out_gpu": {k: d.index.to_numpy()[v] for k, v in parts.items()}}


MIN_SOURCE_ROWS = 20  # timed runs a source needs to be held out: fewer say little about a new cluster


def source_of(meta: pd.DataFrame) -> pd.Series:
    """Each row's source: one public table, or one cluster under one framework. The Playbook's Nanotron runs
    (the 8B's file with them), vTrain's A100 runs, DLPerf's V100 table, NVIDIA's NeMo 24.07 table (its three
    revisions together), NVIDIA's Megatron-Bridge dense runs (H100 and Blackwell), its MoE runs, the collector's own
    GPU runs per GPU (sweeps and probes: collector-h200), each CPU sitting; any other row is its sweep."""
    sweep = meta["sweep_id"].fillna("").astype(str) if "sweep_id" in meta else pd.Series("", index=meta.index)
    text = meta["source"].fillna("").astype(str) if "source" in meta else pd.Series("", index=meta.index)
    domain = meta["domain"].astype(str)
    published, cpu = _published(meta), domain == "cpu"
    out = sweep.where(sweep != "", "unknown")
    out = out.mask(sweep.str.startswith("playbook"), "playbook").mask(sweep.str.startswith("vtrain"), "vtrain")
    out = out.mask(sweep.str.startswith("dlperf"), "dlperf")
    out = out.mask(published, "nvidia-dense").mask(published & (sweep == MOE_SWEEP), "nvidia-moe")
    out = out.mask(published & text.str.startswith("NVIDIA/NeMo docs"), "nemo-24.07")
    own_gpu = ~cpu & (sweep.str.startswith("gpu-") | sweep.str.startswith("probe-"))
    return out.mask(own_gpu, "collector-" + domain).mask(cpu & ~sweep.str.startswith(SITTING_PREFIX), "cpu")


def source_splits(meta: pd.DataFrame) -> dict[str, dict[str, np.ndarray]]:
    """``source/held_out-<source>``: every GPU source with MIN_SOURCE_ROWS timed runs held out whole (its failed
    runs too), trained on every other row, fake traces and CPU runs among them: a cluster and framework never seen.
    Indices into meta."""
    source, fake = source_of(meta), is_fake(meta)
    timed = (meta["status"] == "ok") & meta["iter_time_s"].notna() & ~fake
    gpu = (meta["domain"].astype(str) != "cpu") & ~fake
    counts = source[gpu & timed].value_counts()
    splits = {}
    for name in sorted(counts[counts >= MIN_SOURCE_ROWS].index):
        held = gpu & (source == name)
        parts = _split(meta.reset_index(drop=True), held.reset_index(drop=True), f"source:{name}")
        splits[f"source/held_out-{name}"] = {k: meta.index.to_numpy()[v] for k, v in parts.items()}
    return splits
