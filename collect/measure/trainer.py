"""One plan on one rank: build the parallelised model, its optimizer and data, and step.

The same code runs under the local spawner (CPU, gloo) and under torchrun
(GPU, NCCL); only ``device`` differs.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn
from torch.distributed.tensor.parallel import loss_parallel

from collect.parallel.dp import build_optimizer
from collect.parallel.mesh import build_mesh
from collect.parallel.parallelize import parallelize
from collect.parallel.pp import build_schedule, split_stage, stage_ids
from collect.schema import RunSpec
from collect.workloads.gpt import GPT, cross_entropy_loss
from collect.workloads.llama import Llama

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODELS = {"gpt": GPT, "llama": Llama, "moe": Llama}  # a moe model is a Llama whose MoE layers hold experts


class PlanTrainer:
    """Owns everything a plan allocates on this rank; ``close()`` releases it. ``mesh`` and ``meta``: the device
    mesh (or its named sub-meshes) and this rank's meta modules (``meta_modules``), when built beforehand, as a
    trace under fake tensors must (collect.fake.trace)."""

    def __init__(self, spec: RunSpec, device: torch.device, mesh=None, meta: dict | None = None):
        self.spec, self.device = spec, device
        plan = spec.plan
        self.mesh = build_mesh(plan, device.type) if mesh is None else mesh
        meta = meta_modules(spec, self.mesh) if meta is None else meta
        backend = spec.cluster.backend
        if plan.pp_enabled:
            self.stages = {s: parallelize(module, self.mesh, plan, device, backend) for s, module in meta.items()}
            self.schedule, self.pipeline_stages = build_schedule(
                self.stages, plan, self.mesh["pp"], device, cross_entropy_loss
            )
            modules = list(self.stages.values())
        else:
            self.model = parallelize(meta[None], self.mesh, plan, device, backend)
            modules = [self.model]
        params = [p for m in modules for p in m.parameters()]
        self.optimizer = build_optimizer(params, plan.sharding, self.mesh["dp"])
        self.tokens, self.targets = self._make_batch()

    def _make_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        w, plan = self.spec.workload, self.spec.plan
        # Same data on every tp and pp rank of a replica, different across replicas.
        generator = torch.Generator().manual_seed(self.mesh["dp"].get_local_rank())
        samples = w.micro_batch_size * plan.num_microbatches
        data = torch.randint(0, w.vocab, (samples, w.seq_len + 1), generator=generator)
        return data[:, :-1].to(self.device), data[:, 1:].to(self.device)

    def step(self) -> None:
        """One optimizer step over all micro-batches."""
        if self.spec.plan.pp_enabled:
            self._pipeline_step()
        else:
            self._accumulation_step()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _pipeline_step(self) -> None:
        inputs = (self.tokens,) if any(s.is_first for s in self.pipeline_stages) else ()
        target = self.targets if any(s.is_last for s in self.pipeline_stages) else None
        # the last stage keeps each micro-batch's output for step()'s return value unless told not to (Megatron's way)
        self.schedule.step(*inputs, target=target, return_outputs=self.spec.plan.pipeline_keeps_outputs)

    def _accumulation_step(self) -> None:
        n = self.spec.plan.num_microbatches
        # the loss reads vocabulary-sharded logits where the head left them so (collect.parallel.tp)
        loss_context = loss_parallel if self.spec.plan.loss_parallel and self.spec.plan.tp_enabled else nullcontext
        for i, (x, y) in enumerate(zip(self.tokens.chunk(n), self.targets.chunk(n))):
            # DDP all-reduces only on the last micro-batch; FSDP reduce-scatters each
            # time (its default, which keeps gradients sharded between micro-batches).
            last = i == n - 1
            sync = (
                self.model.no_sync()
                if isinstance(self.model, nn.parallel.DistributedDataParallel) and not last
                else nullcontext()
            )
            with sync, loss_context():
                loss = cross_entropy_loss(self.model(x), y) / n
                loss.backward()

    def close(self) -> None:
        for name in ("schedule", "pipeline_stages", "stages", "model", "optimizer", "tokens", "targets", "mesh"):
            if hasattr(self, name):
                delattr(self, name)


def meta_modules(spec: RunSpec, mesh) -> dict[int | None, nn.Module]:
    """This rank's model on the meta device: the whole model (key None), or its pipeline stages by index."""
    w, plan = spec.workload, spec.plan
    with torch.device("meta"):
        meta_model = MODELS[w.family](w).to(TORCH_DTYPES[w.dtype])
    if not plan.pp_enabled:
        return {None: meta_model}
    return {s: split_stage(meta_model, plan, s) for s in stage_ids(plan, mesh["pp"].get_local_rank())}
