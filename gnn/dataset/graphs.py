"""The graph dataset: one execution graph per measured row of data/runs, and per full-size plan traced under fake
tensors in data/fake (its peak as allocated, gnn.dataset.rows.fake_as_gpu_rows; no time).

    python -m gnn.dataset          # build (or load the cached) dataset and print its size

Targets: log iteration time (NaN for the fake traces), log peak memory (NaN where not measured, e.g. the
vTrain rows) and the oom label. Each graph also carries the row's index into
``PlanGraphs.meta``, a DataFrame of the rows with their flat features and
simulator outputs, used for splitting and by the baselines. Processing runs
once; the cache key hashes the Parquet files and the graph code, so it is
rebuilt when either changes.
"""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch_geometric.data import Data, InMemoryDataset
from tqdm import tqdm

from collect import REPO
from collect.hardware.records import PRESET_DIR
from collect.schema import RunSpec
from gnn.costs.hardware import HardwareModel, hardware_model
from gnn.dataset.featurize import featurize_arrays
from gnn.dataset.rows import (
    fake_as_gpu_rows,
    fake_stores,
    load_fake,
    load_runs,
    measured_pp_rank,
    row_to_spec,
    with_domain,
)
from gnn.dataset.sources import source_files


def _log_or_nan(value) -> float:
    return math.log(value) if value is not None and value == value else float("nan")


def _cache_key(paths: list[Path], hardware_dir: Path) -> str:
    """Hashes the runs, the hardware records their costs come from (measured and presets), and the source of
    every project module this one imports, directly or not (gnn.dataset.sources): the code that turns runs
    into graphs."""
    h = hashlib.sha256()
    journals = [p.with_suffix(".journal.jsonl") for p in paths]
    hardware = sorted(hardware_dir.glob("*.json")) + sorted(PRESET_DIR.glob("*.json"))
    for p in sorted(paths) + [j for j in journals if j.exists()] + hardware + source_files(["gnn.dataset.graphs"]):
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def to_data(arrays: dict[str, np.ndarray]) -> Data:
    return Data(**{k: torch.from_numpy(v) for k, v in arrays.items()})


def featurize_spec(
    spec: RunSpec, hw: HardwareModel, flags: dict, memory_pp_rank: int | None = None
) -> tuple[Data, dict]:
    """A plan's execution graph as a PyG graph, and its flat features and simulator outputs."""
    arrays, flat = featurize_arrays(spec, hw, flags, memory_pp_rank=memory_pp_rank)
    return to_data(arrays), flat


def featurize(row, hardware_dir: str = "data/hardware") -> tuple[Data, dict]:
    spec, hw_name, flags = row_to_spec(row)
    return featurize_spec(spec, hardware_model(hw_name, hardware_dir), flags, measured_pp_rank(row))


class PlanGraphs(InMemoryDataset):
    def __init__(self, root: str | Path = REPO / "data", runs: list[str | Path] | None = None, fake: bool = True):
        self.runs = [Path(p) for p in (runs or sorted((Path(root) / "runs").glob("*.parquet")))]
        self.fake_dir = Path(root) / "fake" if fake else None
        stores = fake_stores(self.fake_dir) if fake else []
        self.hardware_dir = str(Path(root) / "hardware")
        self.key = _cache_key(self.runs + [p for p in stores if p.exists()], Path(self.hardware_dir))
        super().__init__(str(root), log=False)  # our own progress bar says what it builds
        self.load(self.processed_paths[0])
        self.meta = pd.read_parquet(self.processed_paths[1])

    @property
    def processed_file_names(self) -> list[str]:
        return [f"plan_graphs-{self.key}.pt", f"plan_graphs-{self.key}.meta.parquet"]

    def process(self) -> None:
        fake = fake_as_gpu_rows(load_fake(self.fake_dir)) if self.fake_dir else pd.DataFrame()
        df = pd.concat([load_runs(self.runs), with_domain(fake)] if len(fake) else [load_runs(self.runs)])
        df = df.reset_index(drop=True)
        graphs, metas = [], []
        start = time.perf_counter()
        for i, row in enumerate(tqdm(df.to_dict("records"), desc="building graphs", unit="graph")):
            data, flat = featurize(row, self.hardware_dir)
            data.y = torch.tensor([[_log_or_nan(row.get("iter_time_s")), _log_or_nan(row.get("peak_mem_bytes"))]])
            data.oom = torch.tensor([float(row["status"] == "oom")])
            data.row = torch.tensor([i])
            graphs.append(data)
            metas.append(flat)
        meta = pd.concat([df, pd.DataFrame(metas)], axis=1)
        meta.attrs["graphs_per_s"] = len(df) / (time.perf_counter() - start)
        self.save(graphs, self.processed_paths[0])
        meta.to_parquet(self.processed_paths[1], index=False)


def main() -> None:
    ds = PlanGraphs()
    print(
        f"{len(ds)} graphs ({ds.meta.domain.value_counts().to_dict()}), "
        f"median {int(ds.meta.num_nodes.median())} nodes, cache {ds.processed_paths[0]}"
    )
