"""The surrogate network for inference, in plain torch: what a loaded model runs, without PyG or Lightning.

It mirrors gnn.model.network.PlanGNN module for module (the same names, so the same
state dict): GINE layers as ``lin`` (edges) and a two-layer ReLU ``nn``, a
three-layer ReLU ``head``. Its forward pass is gnn.model.fused's, which runs every
member at once in plain torch; importing torch_geometric alone cost 2.6 s of
each command-line prediction (it imports torch._dynamo).
"""

from __future__ import annotations

import torch
from torch import nn

from gnn.model.fused import forward_members
from gnn.model.physics_base import offset_from_physics, time_base_for
from gnn.model.standardize import Standardize


class ReluMLP(nn.Module):
    """torch_geometric.nn.MLP(channels, norm=None) as gnn.model.fused reads it: linears with ReLU between."""

    act_first, plain_last = False, True

    def __init__(self, channels: list[int]):
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(channels[:-1], channels[1:]))
        self.norms = nn.ModuleList(nn.Identity() for _ in channels[1:-1])
        self.act = nn.ReLU()


class GINELayer(nn.Module):
    """torch_geometric.nn.GINEConv(nn, edge_dim) with a fixed eps, as gnn.model.fused reads it."""

    def __init__(self, hidden: int, edge_dim: int):
        super().__init__()
        self.nn = ReluMLP([hidden, hidden, hidden])
        self.lin = nn.Linear(edge_dim, hidden)
        self.register_buffer("eps", torch.zeros(1))


class InferenceGNN(nn.Module):
    def __init__(
        self,
        node_dim: int,
        edge_dim: int,
        global_dim: int,
        sim_index: tuple[int, int] | None,
        hidden: int = 64,
        num_layers: int = 3,
        feature_names: list[str] | None = None,
        time_base: str = "analytical",
    ):
        super().__init__()
        self.sim_index = sim_index
        self.time_base = time_base_for(sim_index, time_base, feature_names)
        self.node_norm, self.global_norm = Standardize(node_dim), Standardize(global_dim)
        self.node_in = nn.Linear(node_dim, hidden)
        self.convs = nn.ModuleList(GINELayer(hidden, edge_dim + 1) for _ in range(num_layers))
        self.head = ReluMLP([2 * hidden + global_dim, hidden, hidden, 3])

    def physics_offset(self, u) -> torch.Tensor:
        """[n_graphs, 3] added to the heads: the log time and log memory the network corrects (0 without physics)."""
        return offset_from_physics(u, self.sim_index, self.time_base)


class Member(nn.Module):
    """One ensemble member as inference needs it: the network and its input masks, with the same state-dict
    keys as the training module (gnn.model.lightning.Surrogate), built from that module's hyper-parameters
    (gnn.model.checkpoint). Run through gnn.model.fused.forward_members."""

    def __init__(
        self,
        node_dim: int,
        edge_dim: int,
        global_dim: int,
        sim_index,
        physics_columns: dict,
        physics: bool = True,
        hidden: int = 64,
        num_layers: int = 3,
        dropout: float = 0.1,
        feature_names: list[str] | None = None,
        time_base: str = "analytical",
        **training,
    ):
        super().__init__()
        self.config = {
            "node_dim": node_dim,
            "edge_dim": edge_dim,
            "global_dim": global_dim,
            "sim_index": list(sim_index),
            "physics_columns": physics_columns,
            "physics": physics,
            "hidden": hidden,
            "num_layers": num_layers,
            "dropout": dropout,
            "feature_names": feature_names,
            "time_base": time_base,
            **training,
        }
        self.model = InferenceGNN(
            node_dim,
            edge_dim,
            global_dim,
            tuple(sim_index) if physics else None,
            hidden,
            num_layers,
            feature_names,
            time_base,
        )
        self.register_buffer("x_mask", torch.ones(node_dim))
        self.register_buffer("u_mask", torch.ones(global_dim))

    def forward(self, batch) -> torch.Tensor:
        """[n_graphs, 3] for one member alone (the ensemble runs all members at once through gnn.model.fused)."""
        return forward_members(nn.ModuleList([self]), batch)[0]
