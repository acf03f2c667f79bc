"""Train the GNN surrogate on one named split, log it to MLflow, register it if it is better.

    python -m gnn.train [--split cpu/random] [--max-epochs 80] [--no-physics] [--accelerator gpu --devices 2]

Deterministic (seeded, deterministic algorithms). Early stopping and the
checkpoint kept follow validation time MAPE. CPU by default; the same code runs
with Lightning's DDP strategy on GPUs.
"""
from __future__ import annotations

import argparse
import tempfile
from dataclasses import asdict, dataclass

import lightning as L
import mlflow
import numpy as np
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torch_geometric.data.lightning import LightningDataset
from torch_geometric.loader import DataLoader

from gnn.baselines import SIM_COLUMNS
from gnn.dataset import PlanGraphs
from gnn.features import NODE_DIM
from gnn.lightning_module import Surrogate
from gnn.splits import named_splits

EST_TIME_NODE_COLUMN = NODE_DIM - 4  # log per-node cost estimate (gnn.features.node_features)


@dataclass
class TrainConfig:
    hidden: int = 64
    num_layers: int = 3
    dropout: float = 0.1
    lr: float = 2e-3
    weight_decay: float = 1e-5
    batch_size: int = 64
    max_epochs: int = 80
    patience: int = 15
    physics: bool = True
    seed: int = 0


def build_module(ds: PlanGraphs, cfg: TrainConfig, train_idx: np.ndarray) -> Surrogate:
    names = [c for c in ds.meta.columns if c.startswith("f_")]
    module = Surrogate(node_dim=ds.num_node_features, edge_dim=ds.num_edge_features, global_dim=len(names),
                       sim_index=(names.index("f_log_sim_time"), names.index("f_log_sim_mem")),
                       physics_columns={"node": [EST_TIME_NODE_COLUMN],
                                        "global": [names.index(c) for c in SIM_COLUMNS]},
                       physics=cfg.physics, hidden=cfg.hidden, num_layers=cfg.num_layers, dropout=cfg.dropout,
                       lr=cfg.lr, weight_decay=cfg.weight_decay)
    train = ds[torch.as_tensor(train_idx)]
    module.model.node_norm.fit(torch.cat([g.x for g in train]))
    module.model.global_norm.fit(torch.cat([g.u for g in train]))
    return module


def fit(ds: PlanGraphs, parts: dict, cfg: TrainConfig, callbacks=(), logger=False, **trainer_kwargs) -> Surrogate:
    L.seed_everything(cfg.seed, workers=True)
    module = build_module(ds, cfg, parts["train"])
    data = LightningDataset(ds[torch.as_tensor(parts["train"])], ds[torch.as_tensor(parts["val"])],
                            batch_size=cfg.batch_size, num_workers=0)
    with tempfile.TemporaryDirectory() as ckpt_dir:
        best = ModelCheckpoint(dirpath=ckpt_dir, monitor="val_time_mape", mode="min")
        trainer = L.Trainer(max_epochs=cfg.max_epochs, deterministic=True, logger=logger, enable_model_summary=False,
                            callbacks=[EarlyStopping("val_time_mape", patience=cfg.patience), best, *callbacks],
                            enable_progress_bar=False, **trainer_kwargs)
        trainer.fit(module, datamodule=data)
        if best.best_model_path:
            module.load_state_dict(torch.load(best.best_model_path, weights_only=False)["state_dict"])
    module.best_val_time_mape = float(best.best_model_score) if best.best_model_score is not None else float("nan")
    return module.eval()


@torch.no_grad()
def predict(module: Surrogate, graphs, batch_size: int = 512) -> np.ndarray:
    """[n, 3] raw outputs: log time, log memory, oom logit."""
    outs = [module(batch) for batch in DataLoader(graphs, batch_size=batch_size)]
    return torch.cat(outs).numpy() if outs else np.zeros((0, 3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="cpu/random")
    parser.add_argument("--max-epochs", type=int, default=TrainConfig.max_epochs)
    parser.add_argument("--no-physics", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", default="1")
    args = parser.parse_args()
    from gnn.tracking import dataset_version, register_if_better, setup

    setup()
    ds = PlanGraphs()
    parts = named_splits(ds.meta)[args.split]
    cfg = TrainConfig(max_epochs=args.max_epochs, physics=not args.no_physics, seed=args.seed)
    with mlflow.start_run(run_name=f"gnn {args.split}"):
        mlflow.log_params({**asdict(cfg), "split": args.split, "dataset_version": dataset_version(ds.runs)})
        module = fit(ds, parts, cfg, accelerator=args.accelerator, devices=args.devices)
        test = ds.meta.loc[parts["test"]]
        out = predict(module, ds[torch.as_tensor(parts["test"])])
        mape = float(np.mean(np.abs(np.exp(out[:, 0]) / test["iter_time_s"].to_numpy() - 1)))
        mlflow.log_metrics({"val_time_mape": module.best_val_time_mape, "test_time_mape": mape})
        # pickle: the model takes a PyG batch, which the default traced pt2 format cannot record
        info = mlflow.pytorch.log_model(module, name="model", serialization_format="pickle")
        registered = register_if_better(info.model_uri, "val_time_mape", module.best_val_time_mape)
    print(f"{args.split}: val time MAPE {module.best_val_time_mape:.4f}, test {mape:.4f}, "
          f"{'registered as champion' if registered else 'not better than the champion'}")


if __name__ == "__main__":
    main()
