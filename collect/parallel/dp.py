"""Data parallelism and optimizer-state sharding over the mesh's dp axis.

none: DDP (gradient all-reduce in buckets, overlapped with backward).
zero1: DDP for gradients plus ZeroRedundancyOptimizer, which shards AdamW
    state over dp and all-gathers (broadcasts) updated parameters.
fsdp_grad_op: FSDP2 ``fully_shard`` keeping parameters unsharded between
    forward and backward (reshard_after_forward=False, ZeRO-2-like traffic).
fsdp_full: FSDP2 resharding after forward (ZeRO-3).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

LEARNING_RATE = 1e-4  # value irrelevant to speed and memory; any finite step works


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, reshard_after_forward: bool) -> None:
    # Shard block by block so only one block's parameters are gathered at a time,
    # then the root for embeddings, final norm and head (torchtitan apply_fsdp).
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh, device: torch.device, pipelined: bool) -> nn.Module:
    device_ids = [device.index] if device.type == "cuda" else None
    # NOTE: a pipeline schedule drives DDP's reducer itself, once per micro-batch;
    # DDP's first-iteration bucket rebuild then records every parameter once per
    # micro-batch and trips an internal assert. find_unused_parameters=True is
    # the documented switch that skips the rebuild.
    return DistributedDataParallel(
        model, process_group=dp_mesh.get_group(), device_ids=device_ids, find_unused_parameters=pipelined
    )


def build_optimizer(params: list[nn.Parameter], sharding: str, dp_mesh: DeviceMesh) -> torch.optim.Optimizer:
    # CUDA's default step, torch's foreach kernels, refuses a group mixing DTensors and plain tensors, which tensor
    # parallelism without FSDP leaves (gnn.costs.analytic.steps_one_by_one): those are stepped one by one, as on a CPU
    foreach = False if len({isinstance(p, DTensor) for p in params}) > 1 else None
    if sharding == "zero1":
        return ZeroRedundancyOptimizer(
            params, optimizer_class=torch.optim.AdamW, process_group=dp_mesh.get_group(), lr=LEARNING_RATE,
            foreach=foreach,
        )  # fmt: skip
    return torch.optim.AdamW(params, lr=LEARNING_RATE, foreach=foreach)
