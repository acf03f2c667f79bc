"""Shared builders: tiny GPT specs that run in about a second on gloo ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from collect.schema import RunSpec

TINY = dict(layers=4, hidden=64, heads=4, seq_len=32, vocab=128, micro_batch_size=2)


def tiny_spec(
    world_size: int | None = None, memory_bytes: int = 2**30, workload: dict | None = None, **plan
) -> RunSpec:
    dp, nmb = plan.get("dp", 1), plan.get("num_microbatches", 1)
    w = {**TINY, **(workload or {})}
    w.setdefault("global_batch_size", dp * w["micro_batch_size"] * nmb)
    ws = world_size or dp * plan.get("tp", 1) * plan.get("pp", 1)
    return RunSpec.model_validate(
        {"workload": w, "plan": plan, "cluster": {"devices_per_node": ws, "memory_bytes": memory_bytes}}
    )


@pytest.fixture
def spec_factory():
    return tiny_spec


@pytest.fixture(scope="session")
def vtrain_dataset(tmp_path_factory):
    """The graph dataset over the shipped vTrain rows, built once into a temporary cache."""
    from gnn.dataset.graphs import PlanGraphs

    repo = Path(__file__).resolve().parents[1]
    root = tmp_path_factory.mktemp("data")
    (root / "hardware").symlink_to(repo / "data" / "hardware")
    return PlanGraphs(root=root, runs=[repo / "data" / "runs" / "vtrain-a100.parquet"])


@pytest.fixture(scope="session")
def predictor_path(vtrain_dataset, tmp_path_factory):
    """A small ensemble trained on the shipped A100 rows, saved to a file: the serve and engine tests' model."""
    from gnn.dataset.splits import named_splits
    from gnn.inference.coverage import training_range
    from gnn.inference.predictor import BatchPredictor
    from gnn.predictors.surrogate import TrainConfig, train_ensemble

    repo = Path(__file__).resolve().parents[1]
    parts = named_splits(vtrain_dataset.meta)["a100/random"]
    small = {k: v[:200] for k, v in parts.items()}
    cfg = TrainConfig(max_epochs=4, hidden=16, num_layers=2, batch_size=32, members=2)
    ensemble = train_ensemble(vtrain_dataset, small, cfg, progress=False)
    path = tmp_path_factory.mktemp("model") / "predictor.pt"
    info = {
        "name": "test-model",
        "split": "a100/random",
        "trained_range": training_range(vtrain_dataset.meta.loc[small["train"]]),
    }
    BatchPredictor(ensemble, repo / "data" / "hardware", info).save(path)
    return path
