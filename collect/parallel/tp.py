"""Tensor (and sequence) parallelism through DTensor's ``parallelize_module``.

The Megatron split, as torchtitan's ``apply_tp``: q/k/v and the first MLP
matmul column-wise (SwiGLU's gate w3 too; key/value heads split like query
heads, so kv_heads must divide by tp), the attention output and second MLP matmul row-wise, the
token embedding split over the vocabulary, the LM head column-wise. With
sequence parallelism the norms and the residual stream are sharded along the
sequence (dim 1), turning each block's all-reduce into reduce-scatter +
all-gather. With ``loss_parallel`` the head's logits stay sharded over the
vocabulary, a DTensor the loss reads under torch's ``loss_parallel()``
(torchtitan's; collect.measure.trainer); else they are gathered whole.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool, loss_parallel: bool = False) -> None:
    residual = Shard(1) if sequence_parallel else Replicate()
    if model.embeddings is not None:
        parallelize_module(
            model.embeddings, tp_mesh, {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())}
        )
    if model.norm is not None:
        logits = Shard(-1) if loss_parallel else Replicate()
        top_plan = {
            "output": ColwiseParallel(input_layouts=residual, output_layouts=logits, use_local_output=not loss_parallel)
        }
        if sequence_parallel:
            top_plan["norm"] = SequenceParallel()
        parallelize_module(model, tp_mesh, top_plan)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, _block_plan(block, sequence_parallel, residual))
    if sequence_parallel and model.embeddings is not None:
        # The embedding output is replicated; the first block takes its sequence shard.
        first = next(iter(model.layers.values()))
        parallelize_module(
            first,
            tp_mesh,
            PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True),
        )


def _block_plan(block: nn.Module, sequence_parallel: bool, residual) -> dict:
    plan = {
        "attention": PrepareModuleInput(input_layouts=(residual,), desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=residual),
        "feed_forward": PrepareModuleInput(input_layouts=(residual,), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=residual),
    }
    if hasattr(block.feed_forward, "w3"):  # SwiGLU's gate runs beside w1, split the same way
        plan["feed_forward.w3"] = ColwiseParallel()
    if sequence_parallel:
        plan["attention_norm"] = SequenceParallel()
        plan["ffn_norm"] = SequenceParallel()
    return plan
