"""Compose the parallelisms on one (stage of a) model, in torchtitan's order."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from collect.parallel.ac import apply_ac
from collect.parallel.dp import apply_ddp, apply_fsdp
from collect.parallel.ep import apply_ep, shard_experts_fsdp
from collect.parallel.tp import apply_tp
from collect.schema import Plan


def parallelize(model: nn.Module, mesh: DeviceMesh, plan: Plan, device: torch.device, backend: str) -> nn.Module:
    """Takes a meta-device model, returns it materialised and parallelised on ``device``, its ranks talking over
    ``backend`` (cluster.backend)."""
    # TP first: it replaces parameters by DTensors that FSDP then shards further.
    if plan.tp_enabled:
        apply_tp(model, mesh["tp"], plan.sequence_parallel, plan.loss_parallel)
    _tie(model)  # TP distributed a tied embedding and head separately
    if plan.ep_enabled:
        apply_ep(model, mesh["ep"])
    # Checkpointing wraps blocks after TP installed its hooks and before FSDP
    # shards the wrapped blocks, so recompute re-runs the TP collectives too.
    apply_ac(model, plan.recompute)
    fsdp = plan.fsdp_enabled
    if fsdp:
        if plan.ep_enabled:
            shard_experts_fsdp(model, mesh, plan.reshard_after_forward, backend)
        # Shard while still on meta: the unsharded model is never materialised.
        apply_fsdp(model, mesh["dp"], reshard_after_forward=plan.reshard_after_forward)
    model.to_empty(device=device)
    _tie(model)  # to_empty materialised them separately too (FSDP2 keeps the tie; then this does nothing)
    model.init_weights()
    if not fsdp and plan.dp_enabled:
        # DDP needs real parameters, so it comes after materialisation.
        model = apply_ddp(model, mesh["dp"], device, pipelined=plan.pp_enabled)
    return model


def _tie(model: nn.Module) -> None:
    if hasattr(model, "tie_weights"):
        model.tie_weights()
