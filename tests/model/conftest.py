"""A real (small) GNN ensemble on the shipped vTrain rows, trained once for the model tests."""

import pytest

from gnn.dataset.splits import named_splits
from gnn.predictors.surrogate import TrainConfig, train_ensemble

TINY = TrainConfig(max_epochs=3, hidden=16, num_layers=2, batch_size=32, members=2)


@pytest.fixture(scope="session")
def small_parts(vtrain_dataset):
    parts = named_splits(vtrain_dataset.meta)["a100/random"]
    return {k: v[:160] for k, v in parts.items()}


@pytest.fixture(scope="session")
def ensemble(vtrain_dataset, small_parts):
    return train_ensemble(vtrain_dataset, small_parts, TINY, progress=False)
