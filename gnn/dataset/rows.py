"""From a dataset row back to the (workload, plan, cluster, hardware) it measured.

External rows (vTrain) leave unstated fields empty in data/. A prediction
still needs a value, so the model input fills them with the assumptions
below. Each is flagged in the features (``*_known`` = 0) and never written
back to the data.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from collect.fake.device import allocatable
from collect.schema import Cluster, Plan, RunSpec, Workload
from collect.schema.plan import CLUSTER_LATER_FIELDS
from collect.schema.plan import LATER_FIELDS as PLAN_LATER_FIELDS
from collect.schema.workload import LATER_FIELDS
from collect.store import ResultStore

ASSUMED_VOCAB = 51200  # Megatron's padded GPT-2 vocabulary, the default of the framework vTrain measured
FAKE_FINGERPRINT = "h100-80gb"  # the preset the full-size fake sweeps name (collect/sweeps/fake-*.yaml)
ASSUMED_DTYPE = "bfloat16"  # A100 Megatron runs use 16-bit training; the source does not say which


def _get(row, name, default=None):
    # a mapping (dict, pandas Series: a Series' own attributes such as .dtype shadow its columns) or a namedtuple
    value = row.get(name, default) if hasattr(row, "get") else getattr(row, name, default)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return default
    return value


def _later_fields(row, model, names) -> dict:
    """Fields added with the llama and moe families, at their defaults where a row (a GPT one, or one collected
    before they existed) has none; a column with gaps holds floats, so integers are made integers again."""
    out = {}
    for name in names:
        default = model.model_fields[name].default
        value = _get(row, name, default)
        if isinstance(value, float) and model.model_fields[name].annotation is not float:
            value = int(value)
        out[name] = bool(value) if isinstance(default, bool) else value
    return out


def row_to_spec(row) -> tuple[RunSpec, str, dict]:
    """(spec, hardware name, flags) for a row of data/runs."""
    flags = {
        "vocab_known": _get(row, "vocab") is not None,
        "dtype_known": _get(row, "dtype") is not None,
        "sharding_known": _get(row, "sharding") is not None,
    }
    w = Workload.model_construct(
        family=_get(row, "family", "gpt"),
        layers=int(_get(row, "layers")),
        hidden=int(_get(row, "hidden")),
        heads=int(_get(row, "heads")),
        seq_len=int(_get(row, "seq_len")),
        vocab=int(_get(row, "vocab", ASSUMED_VOCAB)),
        micro_batch_size=int(_get(row, "micro_batch_size")),
        global_batch_size=int(_get(row, "global_batch_size")),
        dtype=_get(row, "dtype", ASSUMED_DTYPE),
        **_later_fields(row, Workload, LATER_FIELDS),
    )
    p = Plan.model_construct(
        dp=int(_get(row, "dp")),
        tp=int(_get(row, "tp")),
        pp=int(_get(row, "pp")),
        sharding=_get(row, "sharding", "none"),
        recompute=_get(row, "recompute", "none"),
        pp_schedule=_get(row, "pp_schedule") if int(_get(row, "pp")) > 1 else None,
        virtual_stages=int(_get(row, "virtual_stages", 1)),
        num_microbatches=int(_get(row, "num_microbatches")),
        sequence_parallel=bool(_get(row, "sequence_parallel", False)),
        **_later_fields(row, Plan, PLAN_LATER_FIELDS),
    )
    hw = _get(row, "fingerprint_id", "a100-80gb")
    c = Cluster.model_construct(
        nodes=int(_get(row, "nodes", 1)),
        devices_per_node=int(_get(row, "devices_per_node")),
        device=_get(row, "device", "cpu"),
        device_kind=_get(row, "device_kind", "cpu"),
        memory_bytes=int(_get(row, "memory_bytes", 80 * 2**30)),
        backend=_get(row, "backend", "gloo"),
        **_later_fields(row, Cluster, CLUSTER_LATER_FIELDS),
    )
    return RunSpec.model_construct(workload=w, plan=p, cluster=c), hw, flags


def measured_pp_rank(row) -> int | None:
    """The pipeline rank whose peak memory a row holds, where its source measured one rank (the playbook: global
    rank 0, the first stage); None: the largest over ranks, as the collector records it."""
    rank = _get(row, "peak_mem_pp_rank")
    return None if rank is None else int(rank)


def fake_stores(folder: Path) -> list[Path]:
    """The Parquet path of every fake sweep in ``folder``, found by its sweep file (collect.fake.sweep writes
    <name>.sweep.json first: a sweep still journalling has no Parquet yet)."""
    return [p.with_name(p.name.removesuffix(".sweep.json") + ".parquet") for p in sorted(folder.glob("*.sweep.json"))]


def load_fake(folder: Path) -> pd.DataFrame:
    """The fake-tensor traces of every sweep in ``folder``, compacted or still journalling, as traced: per-rank peaks
    of the collector's own code at full size, no time. One row per plan; not those whose last stage's peak misses
    its merge of the kept outputs (collect.fake.sweep.merged_on_a_line) until they are traced again."""
    frames = [ResultStore(p).load() for p in fake_stores(folder)]
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if rows.empty:
        return rows
    rows = rows[(rows["status"] == "ok") & (rows["peak_mem_method"] == "fake")]
    from collect.fake.sweep import merged_on_a_line  # lazy: the sweep's imports are not a predictor's start-up

    rows = rows.drop_duplicates("run_id", keep="last")
    return rows[~merged_on_a_line(rows)].reset_index(drop=True)


def fake_as_gpu_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Fake traces as rows to learn GPU memory from: each traced peak as it is, what the collector's code allocates
    (as torch.cuda.max_memory_allocated reads it on a GPU, and every measured GPU row records), on the sweeps' H100
    preset, labelled oom where it exceeds what the device can allocate (collect.fake.device.allocatable). They are
    still ``peak_mem_method: fake``, and their time is missing: a time consumer takes the rows where it is known."""
    if rows.empty:
        return rows
    traced, capacity = rows["peak_mem_bytes"].astype(float), rows["memory_bytes"].astype(float)
    return rows.assign(
        status=["oom" if b > allocatable(m, "cuda") else "ok" for b, m in zip(traced, capacity)],
        fingerprint_id=rows["fingerprint_id"].fillna(FAKE_FINGERPRINT),
        iter_time_s=float("nan"),
    )


def has_time(rows: pd.DataFrame) -> pd.Series:
    """Rows whose iteration time was measured (a fake trace has none)."""
    return rows["iter_time_s"].notna()


def has_memory(rows: pd.DataFrame) -> pd.Series:
    """Rows whose peak memory was measured or traced (vTrain's and most published rows have none)."""
    return rows["peak_mem_bytes"].notna() & (rows["peak_mem_bytes"] > 0)


def load_runs(paths) -> pd.DataFrame:
    """All measured plan rows (reference probes and failed runs excluded), with a domain column."""
    frames = [ResultStore(p).load() for p in paths]  # Parquet plus rows still in a sweep's journal
    df = pd.concat(frames, ignore_index=True)
    df = df[df["status"].isin(["ok", "oom"]) & ~df["is_reference"].fillna(False).astype(bool)]
    df = drop_superseded(df[df["iter_time_s"].notna()]).reset_index(drop=True)
    return with_domain(df)


def with_domain(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(domain=[domain_of(device, kind) for device, kind in zip(df["device"], df["device_kind"])])


CURRENT_CPU_METHOD = "counting-allocator"  # the CPU protocol of cpu-v3 on (data/README.md)


def plan_key(spec: RunSpec) -> str:
    """A plan's id whatever the capacity it was given: a capacity only decides the oom label of a measured peak."""
    cluster = spec.cluster.model_copy(update={"memory_bytes": 1})
    return RunSpec.model_construct(workload=spec.workload, plan=spec.plan, cluster=cluster).run_id


def drop_superseded(df: pd.DataFrame) -> pd.DataFrame:
    """CPU rows of an older protocol (noisier times, peaks read by older methods) whose plan the current protocol
    measured again: the new rows are learned from, the old ones stay in data/runs for the record."""
    cpu = (df["device"] == "cpu").to_numpy()
    if not cpu.any():
        return df
    keys = pd.Series([plan_key(row_to_spec(row)[0]) if c else "" for row, c in zip(df.to_dict("records"), cpu)])
    current = cpu & (df["peak_mem_method"] == CURRENT_CPU_METHOD).to_numpy()
    superseded = cpu & ~current & keys.isin(set(keys[current])).to_numpy()
    return df[~superseded]


def domain_of(device: str | None, device_kind: str | None) -> str:
    """A run's hardware domain, what a model learns and is scored per: a GPU's kind (a100, h100), else cpu."""
    return str(device_kind) if device == "cuda" else "cpu"
