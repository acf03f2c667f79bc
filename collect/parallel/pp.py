"""Pipeline parallelism through ``torch.distributed.pipelining``.

Split first, then parallelise each stage like a whole model (torchtitan
``pipeline_llm``): every rank builds the GPT on the meta device, keeps the
blocks its stages own, and wraps each stage in a PipelineStage. Stage s of
S = pp * virtual_stages owns the s-th run of Plan.stage_layers's counts (even
when the layers divide); interleaved schedules give rank r the stages r, r + pp,
r + 2pp, ... ("looped" placement).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from collect.schema import Plan

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}


def stage_ids(plan: Plan, pp_rank: int) -> list[int]:
    return [pp_rank + k * plan.pp for k in range(plan.virtual_stages)]


def split_stage(meta_model: nn.Module, plan: Plan, stage: int) -> nn.Module:
    """A copy of the (meta) model holding only the given stage's blocks."""
    counts = plan.stage_layers(len(meta_model.layers))
    start = sum(counts[:stage])
    keep = {str(i) for i in range(start, start + counts[stage])}
    part = copy.deepcopy(meta_model)
    for name in list(part.layers.keys()):
        if name not in keep:
            del part.layers[name]
    if stage != 0:
        part.embeddings = None
    if stage != plan.num_stages - 1:
        part.norm = None
        part.output = None
    return part


def build_schedule(
    stage_modules: dict[int, nn.Module], plan: Plan, pp_mesh: DeviceMesh, device: torch.device, loss_fn
) -> tuple[object, list[PipelineStage]]:
    """The schedule and this rank's PipelineStages (first / last tell who feeds inputs and targets)."""
    stages = [
        PipelineStage(module, stage_index=s, num_stages=plan.num_stages, device=device, group=pp_mesh.get_group())
        for s, module in stage_modules.items()
    ]
    schedule_cls = SCHEDULES[plan.pp_schedule]
    if plan.interleaved:
        return schedule_cls(stages, n_microbatches=plan.num_microbatches, loss_fn=loss_fn), stages
    (stage,) = stages
    return schedule_cls(stage, n_microbatches=plan.num_microbatches, loss_fn=loss_fn), stages
