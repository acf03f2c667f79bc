"""Lightning wrapper of PlanGNN: one _common_step for train / val / test."""

from __future__ import annotations

from functools import partial

import lightning as L
import torch
import torch.nn.functional as F

from gnn.model.network import PlanGNN

LOSSES = {"l1": F.l1_loss, "mse": F.mse_loss}  # the regression loss on the log targets, by name
OOM_WEIGHT = 0.1  # the oom head is a tie-breaker beside the memory regression
# Where no time was measured (a fake trace: memory only), the time head's correction is pulled toward none, the
# physics base, each such row weighing this much of a measured row's time error: trained on memory alone, the shared
# layers otherwise left time free to drift on such plans, and with it on measured plans near them (one member on the
# Playbook's held-out 80B runs: 12x too slow on pipelined plans the base put within 10%). At 0.3 of the batch's
# time loss whatever its share of traces, the pull cost measured plans' time (A100 5.6 -> 7.7%, CPU 16.2 -> 18.2%).
UNMEASURED_TIME_WEIGHT = 0.3


class Surrogate(L.LightningModule):
    def __init__(
        self,
        node_dim: int,
        edge_dim: int,
        global_dim: int,
        sim_index: tuple[int, int],
        physics_columns: dict,
        physics: bool = True,
        hidden: int = 64,
        num_layers: int = 3,
        dropout: float = 0.1,
        lr: float = 2e-3,
        weight_decay: float = 1e-5,
        loss: str = "l1",
        memory_weight: float = 1.0,
        feature_names: list[str] | None = None,
        time_base: str = "analytical",
    ):
        super().__init__()
        self.save_hyperparameters()
        self.model = PlanGNN(
            node_dim,
            edge_dim,
            global_dim,
            sim_index if physics else None,
            hidden,
            num_layers,
            dropout,
            feature_names,
            time_base,
        )
        # Without physics the simulator's outputs and the per-node cost estimates are masked out.
        x_mask, u_mask = torch.ones(node_dim), torch.ones(global_dim)
        if not physics:
            x_mask[physics_columns["node"]] = 0
            u_mask[physics_columns["global"]] = 0
        self.register_buffer("x_mask", x_mask)
        self.register_buffer("u_mask", u_mask)

    @property
    def config(self) -> dict:
        """What rebuilds this member for serving (gnn.model.member.Member, through gnn.model.checkpoint)."""
        return dict(self.hparams)

    def forward(self, batch) -> torch.Tensor:
        return self.model(batch.x * self.x_mask, batch.edge_index, batch.edge_attr, batch.u * self.u_mask, batch.batch)

    def _unmeasured_time_prior(self, out: torch.Tensor, batch, has_time: torch.Tensor) -> torch.Tensor:
        """|time correction| summed over the graphs without a measured time, per graph of the batch with one (each
        such graph weighs as a measured graph's error does in the time loss; 0 without physics: no base)."""
        if bool(has_time.all()) or self.model.sim_index is None:
            return torch.zeros((), device=out.device)
        base = self.model.physics_offset(batch.u * self.u_mask)[:, 0]
        return (out[~has_time, 0] - base[~has_time]).abs().sum() / max(int(has_time.sum()), 1)

    def _common_step(self, batch, batch_idx: int, stage: str) -> torch.Tensor:
        out = self(batch)
        y = batch.y
        # On log targets, L1 is the error MAPE measures to first order, and it does not chase the heavy tail of
        # timings disturbed by contention (the noise floor's mean is 3x its median).
        regression = LOSSES[self.hparams.loss]
        # Under DDP the epoch means of val/test metrics are reduced over the ranks (a no-op in one process), so early
        # stopping and the checkpoint judge all validation rows, the same value on every rank. Unreduced, each rank
        # judges its own shard: Lightning keeps a checkpoint only if every rank improved and stops when any one
        # stalls (measured: 0.071 vs 0.064 on the two halves), and best_val_mape is rank 0's half. Training metrics
        # are per step, never reduced.
        log = partial(self.log, sync_dist=stage != "train")
        # a fake trace has memory only; a batch of them alone adds no time loss (a sum over no rows, not a NaN mean)
        has_time = ~torch.isnan(y[:, 0])
        n_time = max(int(has_time.sum()), 1)
        loss = regression(out[has_time, 0], y[has_time, 0], reduction="sum") / n_time
        loss = loss + UNMEASURED_TIME_WEIGHT * self._unmeasured_time_prior(out, batch, has_time)
        time_mape = (torch.exp(out[has_time, 0] - y[has_time, 0]) - 1).abs().sum() / n_time
        log(f"{stage}_time_mape", time_mape, batch_size=n_time, prog_bar=stage == "val")
        has_mem = ~torch.isnan(y[:, 1])
        n_mem = int(has_mem.sum())
        mem_mape = torch.zeros((), device=out.device)
        if n_mem:
            loss = loss + self.hparams.memory_weight * regression(out[has_mem, 1], y[has_mem, 1])
            loss = loss + OOM_WEIGHT * F.binary_cross_entropy_with_logits(out[has_mem, 2], batch.oom[has_mem])
            mem_mape = (torch.exp(out[has_mem, 1] - y[has_mem, 1]) - 1).abs().mean()
        if n_mem or stage != "train":
            # val/test log it on every batch, weighted by its memory rows (0 without any): the reduced metrics are
            # all-reduced one by one in the order first logged, so a rank whose shard starts without memory rows
            # would otherwise pair its val_mape with another rank's val_mem_mape. NaN where no row has memory.
            log(f"{stage}_mem_mape", mem_mape, batch_size=n_mem, prog_bar=stage == "val")
        # the selection metric (early stopping, checkpoint, tuning, champion): both targets count
        log(f"{stage}_mape", time_mape + mem_mape, batch_size=y.shape[0])
        log(f"{stage}_loss", loss, batch_size=y.shape[0])
        return loss

    def training_step(self, batch, batch_idx):
        return self._common_step(batch, batch_idx, "train")

    def validation_step(self, batch, batch_idx):
        self._common_step(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        self._common_step(batch, batch_idx, "test")

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
