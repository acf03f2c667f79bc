"""Activation checkpointing per transformer block (torchtitan ``apply_ac``).

full: keep only each block's input and recompute the whole block in backward.
selective: keep the outputs of matmuls and attention, recompute the cheap
pointwise and norm ops (op-level selective checkpointing through
``create_selective_checkpoint_contexts``).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_aten = torch.ops.aten
_SAVED_OPS = {
    _aten.mm.default,
    _aten.addmm.default,
    _aten.bmm.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    # expert parallelism's dispatch and combine: recomputing them would repeat the communication (torchtitan
    # saves them too)
    torch.ops._c10d_functional.all_to_all_single.default,
}


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_ac(model: nn.Module, mode: str) -> None:
    if mode == "none":
        return
    for index, block in list(model.layers.items()):
        if mode == "full":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False)
        else:
            context_fn = partial(create_selective_checkpoint_contexts, _save_matmuls)
            wrapped = checkpoint_wrapper(block, context_fn=context_fn, preserve_rng_state=False)
        model.layers[index] = wrapped
