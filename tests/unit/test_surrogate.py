"""A real (small) GNN training run, tracked in a temporary MLflow sqlite store, registered and reloaded."""
import mlflow
import numpy as np
import torch

from gnn.splits import named_splits
from gnn.train import TrainConfig, fit, predict


def test_train_track_register_and_reload(vtrain_dataset, tmp_path, monkeypatch):
    dataset = vtrain_dataset
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    from gnn.tracking import CHAMPION, MODEL_NAME, register_if_better, setup

    setup("test")
    parts = named_splits(dataset.meta)["a100/random"]
    small = {k: v[:200] for k, v in parts.items()}
    with mlflow.start_run():
        module = fit(dataset, small, TrainConfig(max_epochs=3, hidden=16, num_layers=2, batch_size=32))
        mlflow.log_metric("val_time_mape", module.best_val_time_mape)
        # pickle: the model takes a PyG batch, which the default traced pt2 format cannot record
        info = mlflow.pytorch.log_model(module, name="model", serialization_format="pickle")
    assert np.isfinite(module.best_val_time_mape)
    assert register_if_better(info.model_uri, "val_time_mape", module.best_val_time_mape)
    assert not register_if_better(info.model_uri, "val_time_mape", module.best_val_time_mape + 1.0)

    graphs = dataset[torch.as_tensor(small["test"])]
    reloaded = mlflow.pytorch.load_model(f"models:/{MODEL_NAME}@{CHAMPION}").eval()
    np.testing.assert_array_equal(predict(reloaded, graphs), predict(module, graphs))
    assert predict(module, graphs).shape == (len(small["test"]), 3)
