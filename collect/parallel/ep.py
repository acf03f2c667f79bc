"""Expert parallelism: each MoE layer keeps experts / ep of its experts (collect.workloads.moe dispatches to them).

A MoE layer is any module with ``shard_experts`` and an ``experts`` child, so this stays model-agnostic.

Under FSDP the experts shard over the ranks that hold the same ones (dp_mod_ep), not over all of dp as the rest of
the model does (torchtitan's apply_fsdp with ep); their gradients, already summed over the ep ranks by the
all-to-all's backward, are divided by all of dp as every other gradient is (on NCCL; gloo cannot scale inside the
reduce-scatter, and a gradient's scale changes neither time nor memory). Where a rank keeps fewer experts than
dp_mod_ep has ranks, they shard along their second dimension (torchtitan's shard_placement_fn): along the first,
FSDP would pad each rank's shard to a whole expert (Mixtral 8x7B, ep 8 on 16 ranks: every rank kept its expert
whole, twice its share).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard


def moe_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "shard_experts")]


def apply_ep(model: nn.Module, ep_mesh: DeviceMesh) -> None:
    for moe in moe_layers(model):
        moe.shard_experts(ep_mesh)


def shard_experts_fsdp(model: nn.Module, mesh: DeviceMesh, reshard_after_forward: bool, backend: str) -> None:
    """Before the blocks are sharded, so a block's own fully_shard leaves its experts to this one. ``backend``: the
    one the plan's ranks talk over (cluster.backend), not the process group's, which a trace's fake group is not."""
    group = mesh["dp_mod_ep"]
    for moe in moe_layers(model):
        few = moe.experts.w1.shape[0] < group.size()
        placement = (lambda param: Shard(1)) if few else None
        fully_shard(moe.experts, mesh=group, reshard_after_forward=reshard_after_forward, shard_placement_fn=placement)
        # It reduces with PREMUL_SUM, which gloo lacks. Not free where the experts' group is one rank: FSDP then
        # copies the divided gradient out of a temporary of its own size.
        if backend != "gloo":
            moe.experts.set_gradient_divide_factor(float(mesh["dp"].size()))
