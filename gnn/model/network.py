"""The surrogate: a GNN body over the execution graph, pooling, and three heads.

Body: GINE message passing that reads edge features; edges are directed (the
schedule's order matters), and a reversed copy of every edge, flagged as
such, lets information flow against dependencies too. Pooling: sum and mean
over nodes, concatenated with the graph-level features. Heads: log iteration
time, log peak memory, and an oom logit. Physics-informed: with ``physics``,
the time head predicts a correction to the fitted analytical model's log time
(gnn.model.physics_base) and the memory head one to the simulator's log peak; the
simulator's outputs are also inputs, so the network learns what the physics
misses rather than the physics itself.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import MLP, GINEConv, global_add_pool, global_mean_pool

from gnn.model.fused import CONV_LINEARS, HEAD_LINEARS
from gnn.model.physics_base import offset_from_physics, time_base_for
from gnn.model.standardize import Standardize


class PlanGNN(nn.Module):
    def __init__(
        self,
        node_dim: int,
        edge_dim: int,
        global_dim: int,
        sim_index: tuple[int, int] | None,
        hidden: int = 64,
        num_layers: int = 3,
        dropout: float = 0.1,
        feature_names: list[str] | None = None,
        time_base: str = "analytical",
    ):
        super().__init__()
        self.sim_index = sim_index  # columns of u holding log sim time and log sim memory; None = no physics
        # what the time head corrects: the fitted analytical model (gnn.model.physics_base) or the raw simulator
        self.time_base = time_base_for(sim_index, time_base, feature_names)
        self.node_norm, self.global_norm = Standardize(node_dim), Standardize(global_dim)
        self.node_in = nn.Linear(node_dim, hidden)
        self.convs = nn.ModuleList(
            GINEConv(MLP([hidden] * (CONV_LINEARS + 1), norm=None), edge_dim=edge_dim + 1) for _ in range(num_layers)
        )
        self.head = MLP([2 * hidden + global_dim, *[hidden] * (HEAD_LINEARS - 1), 3], dropout=dropout, norm=None)

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
        return offset_from_physics(u, self.sim_index, self.time_base)
