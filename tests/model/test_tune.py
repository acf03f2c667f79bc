"""Hyper-parameter search: real Optuna on sqlite, the Lightning pruning callback, resumed by name."""

import mlflow
import optuna
import pytest

from gnn.dataset.splits import named_splits
from gnn.predictors.surrogate import TrainConfig
from gnn.tune import tune


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    from gnn.tracking.runs import setup

    setup("tune-test")


def test_study_reports_every_epoch_and_resumes(vtrain_dataset, tmp_path, tracking):
    parts = named_splits(vtrain_dataset.meta)["a100/random"]
    small = {k: v[:120] for k, v in parts.items()}
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    base = TrainConfig(max_epochs=2, members=1)
    with mlflow.start_run():
        study = tune(vtrain_dataset, small, "t", storage, trials=2, timeout=None, base=base, progress=False)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    # the pruning callback reported the validation metric after every epoch
    assert all(len(t.intermediate_values) == 2 for t in study.trials)
    first = [t.params for t in study.trials]

    with mlflow.start_run():
        again = tune(vtrain_dataset, small, "t", storage, trials=3, timeout=None, base=base, progress=False)
    assert len(again.trials) == 3 and [t.params for t in again.trials[:2]] == first
    nested = mlflow.search_runs(experiment_names=["tune-test"], filter_string="params.trial = '2'")
    assert len(nested) == 1 and nested["metrics.val_selection"].notna().all()
