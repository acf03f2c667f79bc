"""Named, deterministic train / validation / test splits that test generalisation.

Rows of one plan (repeats) always fall on the same side: assignment hashes the
run id. Test sets: random 15%; the largest model shape; the largest world
size; whole strategy families (interleaved 1F1B, full FSDP); the moe model
family (trained on gpt and llama only); on the A100
rows, the largest hidden size and the largest layer counts; on other GPUs (H100), the largest model and the
largest world size. Validation is a
15% hash-slice of what is not test. ``all/random`` is the union of the
domains' random splits: the served model (the champion) is trained on it, so
one model predicts CPU and GPU plans, and its test rows are exactly those of
the domains' random splits.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

SERVING_SPLIT = "all/random"


def _unit(run_id: str, salt: str) -> float:
    return int(hashlib.sha256(f"{salt}:{run_id}".encode()).hexdigest()[:8], 16) / 2**32


def _split(df: pd.DataFrame, test_mask: pd.Series, salt: str) -> dict[str, np.ndarray]:
    u = df["run_id"].map(lambda r: _unit(r, salt))
    val = ~test_mask & (u < 0.15)
    return {"train": np.flatnonzero(~test_mask & ~val), "val": np.flatnonzero(val), "test": np.flatnonzero(test_mask)}


def named_splits(meta: pd.DataFrame) -> dict[str, dict[str, np.ndarray]]:
    """{"cpu/random": {"train": idx, "val": idx, "test": idx}, ...}; indices into meta."""
    splits = {}
    for domain, df in meta.groupby("domain"):
        rows = df.index.to_numpy()
        d = df.reset_index(drop=True)
        tests = {"random": d["run_id"].map(lambda r: _unit(r, "test")) < 0.15}
        if domain == "cpu":
            tests["held_out_shape"] = d["num_params"] == d["num_params"].max()
            tests["held_out_world_size"] = d["world_size"] == d["world_size"].max()
            tests["held_out_interleaved_1f1b"] = d["pp_schedule"] == "interleaved_1f1b"
            tests["held_out_fsdp_full"] = d["sharding"] == "fsdp_full"
            if d["family"].eq("moe").any():  # a family never seen in training: mixture-of-experts
                tests["held_out_moe"] = d["family"] == "moe"
        elif domain == "a100":
            tests["held_out_hidden"] = d["hidden"] == d["hidden"].max()
            tests["held_out_layers"] = d["layers"] >= sorted(d["layers"].unique())[-2]
        else:  # what a GPU user asks of a predictor: a model size and a scale it has not seen
            tests["held_out_size"] = d["num_params"] == d["num_params"].max()
            tests["held_out_scale"] = d["world_size"] == d["world_size"].max()
        for name, mask in tests.items():
            parts = _split(d, mask.fillna(False), name)
            splits[f"{domain}/{name}"] = {k: rows[v] for k, v in parts.items()}
    randoms = [parts for name, parts in splits.items() if name.endswith("/random")]
    splits[SERVING_SPLIT] = {k: np.sort(np.concatenate([p[k] for p in randoms])) for k in ("train", "val", "test")}
    return splits
