"""The surrogate: a GNN body over the execution graph, pooling, and three heads.

Body: GINE message passing that reads edge features; edges are directed (the
schedule's order matters), and a reversed copy of every edge, flagged as
such, lets information flow against dependencies too. Pooling: sum and mean
over nodes, concatenated with the graph-level features. Heads: log iteration
time, log peak memory, and an oom logit. Physics-informed: with ``physics``,
the time head predicts a correction to the fitted analytical model's log time
(gnn.physics_base) and the memory head one to the simulator's log peak; the
simulator's outputs are also inputs, so the network learns what the physics
misses rather than the physics itself.
"""
from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import MLP, GINEConv, global_add_pool, global_mean_pool

from gnn.physics_base import AnalyticalTimeBase


class Standardize(nn.Module):
    """Fixed affine normalisation with statistics from the training graphs, guarded for new inputs.

    A feature constant in training (one sequence length, one vocabulary) carries nothing the model could have
    learned, so it is zeroed rather than divided by ~0: a new value would otherwise arrive as a huge input and
    send the prediction to infinity. Standardised values are clipped for the same reason: outside the data the
    network's correction stays bounded and the physics it corrects keeps the prediction sane.
    """

    CLIP = 10.0
    CONSTANT = 1e-6

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("scale", torch.ones(dim))  # 1 / std, or 0 for a feature constant in training

    def fit(self, values: torch.Tensor) -> None:
        std = values.std(0)
        self.mean.copy_(values.mean(0))
        self.scale.copy_(torch.where(std < self.CONSTANT, torch.zeros_like(std), 1 / std.clamp_min(1e-2)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) * self.scale).clamp(-self.CLIP, self.CLIP)


class PlanGNN(nn.Module):
    def __init__(self, node_dim: int, edge_dim: int, global_dim: int, sim_index: tuple[int, int] | None,
                 hidden: int = 64, num_layers: int = 3, dropout: float = 0.1, feature_names: list[str] | None = None,
                 time_base: str = "analytical"):
        super().__init__()
        self.sim_index = sim_index  # columns of u holding log sim time and log sim memory; None = no physics
        # what the time head corrects: the fitted analytical model (gnn.physics_base) or the raw simulator
        self.time_base = AnalyticalTimeBase(feature_names) if sim_index is not None and time_base == "analytical" else None
        self.node_norm, self.global_norm = Standardize(node_dim), Standardize(global_dim)
        self.node_in = nn.Linear(node_dim, hidden)
        self.convs = nn.ModuleList(
            GINEConv(MLP([hidden, hidden, hidden], norm=None), edge_dim=edge_dim + 1) for _ in range(num_layers))
        self.head = MLP([2 * hidden + global_dim, hidden, hidden, 3], dropout=dropout, norm=None)

    def body(self, x, edge_index, edge_attr) -> torch.Tensor:
        forward_flag = torch.zeros(edge_attr.shape[0], 1, device=edge_attr.device)
        edges = torch.cat([edge_index, edge_index.flip(0)], dim=1)
        attrs = torch.cat([torch.cat([edge_attr, forward_flag], 1), torch.cat([edge_attr, 1 - forward_flag], 1)])
        h = self.node_in(self.node_norm(x))
        for conv in self.convs:
            h = h + torch.relu(conv(h, edges, attrs))
        return h

    def forward(self, x, edge_index, edge_attr, u, batch) -> torch.Tensor:
        """[n_graphs, 3]: log time, log peak memory, oom logit."""
        return self.readout(self.body(x, edge_index, edge_attr), u, batch)

    def readout(self, h, u, batch) -> torch.Tensor:
        """Pool node states per graph, join the graph features, and apply the heads and the physics base."""
        pooled = torch.cat([global_add_pool(h, batch), global_mean_pool(h, batch), self.global_norm(u)], dim=1)
        return self.head(pooled) + self.physics_offset(u)

    def physics_offset(self, u) -> torch.Tensor:
        """[n_graphs, 3] added to the heads: the log time and log memory the network corrects (0 without physics)."""
        if self.sim_index is None:
            return torch.zeros(u.shape[0], 3, dtype=u.dtype, device=u.device)
        base = getattr(self, "time_base", None)  # absent in models saved before the analytical base existed
        time = base(u) if base is not None else u[:, self.sim_index[0]]
        return torch.stack([time, u[:, self.sim_index[1]], torch.zeros_like(time)], 1)


class Member(nn.Module):
    """One ensemble member as inference needs it: the network and its input masks, with the same state-dict
    keys as the training module (gnn.lightning_module.Surrogate), built from that module's hyper-parameters.
    Loading a saved model needs neither Lightning nor any pickled code (gnn.checkpoint)."""

    def __init__(self, node_dim: int, edge_dim: int, global_dim: int, sim_index, physics_columns: dict,
                 physics: bool = True, hidden: int = 64, num_layers: int = 3, dropout: float = 0.1,
                 feature_names: list[str] | None = None, time_base: str = "analytical", **training):
        super().__init__()
        self.config = {"node_dim": node_dim, "edge_dim": edge_dim, "global_dim": global_dim,
                       "sim_index": list(sim_index), "physics_columns": physics_columns, "physics": physics,
                       "hidden": hidden, "num_layers": num_layers, "dropout": dropout,
                       "feature_names": feature_names, "time_base": time_base, **training}
        self.model = PlanGNN(node_dim, edge_dim, global_dim, tuple(sim_index) if physics else None, hidden,
                             num_layers, dropout, feature_names, time_base)
        self.register_buffer("x_mask", torch.ones(node_dim))
        self.register_buffer("u_mask", torch.ones(global_dim))

    def forward(self, batch) -> torch.Tensor:
        return self.model(batch.x * self.x_mask, batch.edge_index, batch.edge_attr, batch.u * self.u_mask, batch.batch)
