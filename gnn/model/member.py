"""One ensemble member as a saved model serves it: the weights of gnn.model.network.PlanGNN, under the state-dict
keys of the training module (gnn.model.lightning.Surrogate), and the physics base the network corrects.

It defines no layer. The network is written once, in PyG (gnn.model.network); a file holds that network's
tensors, and gnn.model.fused runs them by name, every member at once in plain torch: importing torch_geometric
alone cost 2.6 s of each command-line prediction (it imports torch._dynamo). Each tensor is held where the
training module holds it (``model.convs.0.lin.weight``), so the state dict is the same, read and written alike.
"""

from __future__ import annotations

import torch
from torch import nn

from gnn.model.fused import forward_members, weight_names
from gnn.model.physics_base import offset_from_physics, time_base_for


class PhysicsHolder(nn.Module):
    """``model``: the physics base a member corrects (fitted, so it is a module of its own), and the network's
    tensors, placed under it at load time."""

    def __init__(self, sim_index, time_base: str, feature_names):
        super().__init__()
        self.sim_index = sim_index
        self.time_base = time_base_for(sim_index, time_base, feature_names)

    def physics_offset(self, u) -> torch.Tensor:
        """[n_graphs, 3] as gnn.model.network.PlanGNN.physics_offset."""
        return offset_from_physics(u, self.sim_index, self.time_base)


class Member(nn.Module):
    """Built from the training module's hyper-parameters (gnn.model.checkpoint), then loaded with its weights."""

    def __init__(self, **config):
        super().__init__()
        self.config = {**config, "sim_index": list(config["sim_index"])}  # the training module's hparams, saved whole
        sim_index = tuple(config["sim_index"]) if config.get("physics", True) else None
        self.model = PhysicsHolder(sim_index, config.get("time_base", "analytical"), config.get("feature_names"))
        self.register_buffer("x_mask", torch.ones(config["node_dim"]))
        self.register_buffer("u_mask", torch.ones(config["global_dim"]))

    def _load_from_state_dict(self, state_dict, prefix, metadata, strict, missing, unexpected, errors):
        """Place each of the network's tensors where the training module holds it, shaped as the file has it;
        the loading that follows fills them, and names any the file lacks."""
        for name in weight_names(self.config["num_layers"]):
            key = prefix + name
            if key not in state_dict:
                missing.append(key)
                continue
            *path, leaf = name.split(".")
            holder = self
            for part in path:
                if part not in holder._modules:
                    holder.add_module(part, nn.Module())
                holder = holder._modules[part]
            if leaf not in holder._buffers:
                holder.register_buffer(leaf, torch.empty_like(state_dict[key]))
        super()._load_from_state_dict(state_dict, prefix, metadata, strict, missing, unexpected, errors)

    def forward(self, batch) -> torch.Tensor:
        """[n_graphs, 3] for one member alone (the ensemble runs all members at once through gnn.model.fused)."""
        return forward_members(nn.ModuleList([self]), batch)[0]
