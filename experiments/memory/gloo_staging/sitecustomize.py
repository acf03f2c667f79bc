"""Loaded by every Python process whose PYTHONPATH holds this folder (experiments.memory.gloo_staging puts it there
for the collector's ranks): with PLANSIGHT_GLOO_IN_PLACE set, FSDP2's reduce-scatter and all-gather on a gloo
group become in-place all-reduces on FSDP's own buffers, allocating nothing, as NCCL's do. An experiment's
instrument only: it changes how fast they run, and no collected row is made with it."""

import os

if os.environ.get("PLANSIGHT_GLOO_IN_PLACE"):
    import torch
    import torch.distributed as dist

    _reduce_scatter, _all_gather = dist.reduce_scatter_single, dist.all_gather_into_tensor

    def _done() -> dist.Work:
        future = torch.futures.Future()
        future.set_result(None)
        return torch._C._distributed_c10d._create_work_from_future(future)

    def _mine(flat: torch.Tensor, group) -> torch.Tensor:
        return flat.view(dist.get_world_size(group), -1)[dist.get_rank(group)]

    def reduce_scatter_single(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if dist.get_backend(group) != "gloo":
            return _reduce_scatter(output, input, op=op, group=group, async_op=async_op)
        dist.all_reduce(input, group=group)  # summed whatever op FSDP asks: what is allocated is the same
        output.copy_(_mine(input, group).view_as(output))
        return _done() if async_op else None

    def all_gather_into_tensor(output, input, group=None, async_op=False):
        if dist.get_backend(group) != "gloo":
            return _all_gather(output, input, group=group, async_op=async_op)
        output.zero_()
        _mine(output, group).copy_(input.reshape(-1))
        dist.all_reduce(output, group=group)
        return _done() if async_op else None

    dist.reduce_scatter_single, dist.all_gather_into_tensor = reduce_scatter_single, all_gather_into_tensor
