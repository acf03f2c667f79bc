"""One rank of a plan traced under fake tensors: its peak memory at any size, on any world, in one process.

    python -m collect.fake.trace SPEC.json [--rank R]   -> {"peak_mem_bytes": ..., "cpu_s": ...}
    python -m collect.fake.trace SPEC.json [--rank R] [--microbatches 3,5] [--depths 3,4,5]
        -> a line per micro-batch count and depth (with each segment's peak, given depths)

The process joins a fake process group of the plan's world size as rank R (collectives hallucinate their results),
builds the collector's own model (collect.measure.trainer.PlanTrainer) with every tensor fake, and runs the memory
window the collector measures: the model's build and two optimizer steps (AdamW's moments appear in the second),
counting every storage's bytes (collect.fake.counter). Nothing is allocated, so a 70B model on thousands of ranks
traces on this machine; what only the hardware adds (CUDA's context, NCCL's buffers, the caching allocator's
rounding and gaps) is not in it.

Under fake tensors a few things the real run does are done otherwise, each the same in memory:
- the device mesh and its sub-meshes are made before the fake mode (a mesh reads its real rank tensor);
- DDP does not check or broadcast its parameters (nothing to compare), keeps its first buckets (rebuilding them
  broadcasts their order), does not look for unused parameters (that reads which were used) and reduces each
  bucket in place (a fake group's futures carry no tensor);
- a mixture of experts routes every expert the same number of tokens (a fake router's choice has no value; a real
  one's counts depend on its data, so a traced MoE peak is the balanced one; collect.workloads.moe);
- a pipeline stage learns the shapes its neighbours send (the activation of a micro-batch, sequence-sharded under
  sequence parallelism) from the plan, not from them: the real schedule's vote on static shapes and its metadata
  exchange are answered here (the real run, with no static shapes given, always exchanges);
- a pipeline's sends hold their tensors until the schedule lets go of them, as a real group's works do;
- FSDP makes only the chunks of a parameter it reads (its rank's and the first), not one per rank (_Chunks).
A plan of a GPU cluster traced on the CPU takes the GPU's kernels where they keep other memory (collect.fake.kernels).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import time
from collections.abc import Sequence
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed.fsdp._fully_shard._fsdp_param as fsdp_param
import torch.nn.parallel.distributed as ddp_module
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, schedules
from torch.distributed.pipelining._utils import (
    InferenceMode,
    _StageBackwardMeta,
    _StageForwardMeta,
    extract_tensor_metas,
)
from torch.distributed.pipelining.schedules import _PipelineSchedule
from torch.nn.parallel import DistributedDataParallel
from torch.testing._internal.distributed.fake_pg import FakeStore

from collect.fake.counter import LiveBytes
from collect.fake.depth import mark_blocks, mark_optimizer, with_depth
from collect.fake.kernels import on_gpu
from collect.measure.trainer import TORCH_DTYPES, PlanTrainer, meta_modules
from collect.parallel.mesh import build_mesh
from collect.schema import RunSpec
from collect.workloads import moe

MEMORY_WINDOW_STEPS = 2  # collect.measure.plan.MeasureSettings.memory_window_iters: the second has AdamW's state


def trace(spec: RunSpec, rank: int = 0, device: str = "cpu", segments: bool = False) -> dict:
    """Rank ``rank``'s peak bytes over the memory window, and the CPU seconds it took to trace; with ``segments``,
    each segment's peak too (collect.fake.depth). Joins (and leaves) a fake process group: run it in a process of its
    own, or one with no other group. ``device`` "cuda" (on a machine with CUDA) traces the GPU's kernels' memory,
    flash attention's for one, where "cpu" traces the CPU's."""
    start = time.process_time()
    with fake_world(spec.cluster.world_size, rank):
        meshes = named_meshes(spec, device)
        meta = meta_modules(spec, meshes)
        kernels = on_gpu() if spec.cluster.device == "cuda" and device == "cpu" else contextlib.nullcontext()
        with _as_fake_as_possible(spec), kernels, FakeTensorMode(allow_non_fake_inputs=True), LiveBytes() as live:
            trainer = PlanTrainer(spec, torch.device(device), meshes, meta)
            if segments:
                mark_blocks(list(trainer.stages.values()) if spec.plan.pp_enabled else [trainer.model], live)
                mark_optimizer(trainer.optimizer, live)
            for _ in range(MEMORY_WINDOW_STEPS):
                live.mark(("step",))
                trainer.step()
    out = {"peak_mem_bytes": live.peak, "cpu_s": time.process_time() - start}
    return {**out, "segments": [[*key, peak] for key, peak in live.segments.items()]} if segments else out


@contextlib.contextmanager
def fake_world(world_size: int, rank: int):
    """This process as rank ``rank`` of a fake group of ``world_size``, joined for the span (or the one already
    joined: a device mesh keeps its groups, so traces of one world in one process share them)."""
    if dist.is_initialized():
        if (dist.get_world_size(), dist.get_rank()) != (world_size, rank):
            joined = f"rank {dist.get_rank()} of {dist.get_world_size()}"
            raise RuntimeError(f"joined as {joined}, not as rank {rank} of {world_size}")
        yield
        return
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def named_meshes(spec: RunSpec, device: str = "cpu") -> dict[str, DeviceMesh]:
    """The plan's mesh as its named sub-meshes, sliced now, outside the fake mode."""
    mesh = build_mesh(spec.plan, device)
    names = (*mesh.mesh_dim_names, *(("dp",) if spec.plan.ep_enabled else ()))
    return {name: mesh[name] for name in names}


@contextlib.contextmanager
def _as_fake_as_possible(spec: RunSpec):
    """What the real run does that a fake one cannot, done otherwise for the span of a trace (module docstring)."""
    mesh_init = DeviceMesh.__init__

    def real_mesh(self, *args, **kwargs):  # a mesh's coordinates are read from its real rank tensor
        with unset_fake_temporarily():
            mesh_init(self, *args, **kwargs)

    ddp_init = DistributedDataParallel.__init__

    def fake_ddp(self, *args, **kwargs):
        # the search for unused parameters (a pipeline's DDP, to skip the rebuild) reads the used map's values
        ddp_init(self, *args, **{**kwargs, "find_unused_parameters": False})
        self.register_comm_hook(None, _reduced_in_place)
        self.reducer = _FirstBuckets(self.reducer)

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(DeviceMesh, "__init__", real_mesh))
        stack.enter_context(mock.patch.object(DistributedDataParallel, "__init__", fake_ddp))
        for name in ("_verify_param_shape_across_processes", "_sync_module_states"):
            stack.enter_context(mock.patch.object(ddp_module, name, lambda *a, **k: None))
        stack.enter_context(mock.patch.object(moe, "expert_counts", _balanced_counts))
        stack.enter_context(mock.patch.object(moe, "dispatch_plan", _balanced_dispatch))
        stack.enter_context(mock.patch.object(_PipelineSchedule, "_warmup_p2p", _exchange_shapes))
        stack.enter_context(mock.patch.object(PipelineStage, "_recv_meta", _neighbour_shapes(spec)))
        stack.enter_context(mock.patch.object(PipelineStage, "_send_meta", lambda self, meta, dst: None))
        stack.enter_context(mock.patch.object(schedules, "_batch_p2p", _held_p2p(schedules._batch_p2p)))
        stack.enter_context(mock.patch.object(fsdp_param, "_chunk_with_empty", _Chunks))
        yield


class _Chunks(Sequence):
    """FSDP2's split of a parameter into one chunk per rank (fsdp._fully_shard._fsdp_common._chunk_with_empty, empty
    past the last row), each made only when read: FSDP reads its own rank's and the first, and over 8,192 ranks
    making every chunk took 100 s of a 3-block trace. The same views, so the same memory (none)."""

    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int):
        self.tensor, self.num_chunks, self.dim = tensor, num_chunks, dim
        self.rows = -(-tensor.size(dim) // num_chunks)  # torch.chunk's chunk size

    def __len__(self) -> int:
        return self.num_chunks

    def __getitem__(self, index: int) -> torch.Tensor:
        if not 0 <= index < self.num_chunks:
            raise IndexError(index)
        start = index * self.rows
        if start >= self.tensor.size(self.dim):
            return self.tensor.narrow(self.dim, 0, min(self.rows, self.tensor.size(self.dim))).new_empty(0)
        return self.tensor.narrow(self.dim, start, min(self.rows, self.tensor.size(self.dim) - start))


def _held_p2p(batch_p2p):
    """A schedule's p2p batch whose works hold their tensors while the schedule holds the works, as gloo's and
    NCCL's do (a fake group's hold none): the interleaved schedule waits its sends only at the step's end, so every
    activation it sent stays alive until then."""

    def held(p2p_ops, desc=None):
        works = batch_p2p(p2p_ops, desc)
        return [_HeldWork(works, [op.tensor for op in p2p_ops])] if works else works

    return held


class _HeldWork:
    def __init__(self, works, tensors):
        self.works, self.tensors = works, tensors

    def wait(self, *args, **kwargs) -> bool:
        for work in self.works:
            work.wait(*args, **kwargs)
        return True


def _exchange_shapes(self, stages, has_backward, p2p_done) -> None:
    """The schedule's warm-up, voted as the real run votes with no static shapes given: exchange them."""
    for stage in stages:
        stage._inference_mode = InferenceMode.DYNAMIC


def _neighbour_shapes(spec: RunSpec):
    """A stage's _recv_meta: what its neighbour would send, the activation of one micro-batch (its gradient going
    back), sequence-sharded under sequence parallelism."""
    w, plan = spec.workload, spec.plan
    seq = w.seq_len // (plan.tp if plan.sequence_parallel else 1)
    shape, dtype = (w.micro_batch_size, seq, w.hidden), TORCH_DTYPES[w.dtype]

    def recv_meta(self, src_stage: int):
        with unset_fake_temporarily():
            activation = torch.empty(shape, dtype=dtype, device="meta", requires_grad=src_stage < self.stage_index)
            metas = extract_tensor_metas((activation,))
        return _StageForwardMeta(metas) if src_stage < self.stage_index else _StageBackwardMeta(metas)

    return recv_meta


def _reduced_in_place(state, bucket):  # no return annotation: DDP would read this module's as a string
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


class _FirstBuckets:
    """DDP's reducer, never rebuilding its buckets (the C++ object's attributes are read-only: a proxy)."""

    def __init__(self, reducer):
        self._reducer = reducer

    def __getattr__(self, name):
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        return False


def _balanced_counts(chosen: torch.Tensor, experts: int) -> torch.Tensor:
    """Each expert's share of the routed token slots, as even as whole tokens allow (a real tensor)."""
    slots = chosen.numel()
    with unset_fake_temporarily():
        return torch.full((experts,), slots // experts, dtype=torch.long) + (torch.arange(experts) < slots % experts)


def _balanced_dispatch(counts: torch.Tensor, group) -> tuple[list[int], list[int], list[int], torch.Tensor]:
    """collect.workloads.moe.dispatch_plan when every rank routes as evenly (``counts`` from _balanced_counts): each
    receives from every other what it sends. Real index bookkeeping, sized as the real run's."""
    with unset_fake_temporarily():
        send = counts.view(dist.get_world_size(group), -1)
        segment = torch.repeat_interleave(torch.arange(send.numel()), send.flatten())
        order = (segment % send.shape[1]).argsort(stable=True)
        return send.sum(dim=1).tolist(), send.sum(dim=1).tolist(), send.sum(dim=0).tolist(), order


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collect.fake.trace", description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="a RunSpec as JSON: a file, or the JSON itself")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--microbatches", help="micro-batch counts, comma-separated: trace the plan at each")
    parser.add_argument("--depths", help="blocks per pipeline chunk, comma-separated: trace each (collect.fake.depth)")
    args = parser.parse_args(argv)
    text = args.spec if args.spec.lstrip().startswith("{") else open(args.spec).read()
    spec = RunSpec.model_validate_json(text)
    counts, depths = (_ints(values) if values else [None] for values in (args.microbatches, args.depths))
    with fake_world(spec.cluster.world_size, args.rank):
        for count, depth in itertools.product(counts, depths):
            traced_spec = with_microbatches(spec, count) if count else spec
            traced_spec = with_depth(traced_spec, depth) if depth else traced_spec
            traced = trace(traced_spec, args.rank, args.device, segments=depth is not None)
            print(json.dumps({"microbatches": count, "depth": depth, **traced}), flush=True)
    return 0


def _ints(values: str) -> list[int]:
    return [int(v) for v in values.split(",")]


def with_microbatches(spec: RunSpec, count: int) -> RunSpec:
    """The plan at ``count`` micro-batches of the same size (the global batch follows)."""
    samples = spec.plan.dp * spec.workload.micro_batch_size * count
    return spec.model_copy(
        update={
            "plan": spec.plan.model_copy(update={"num_microbatches": count}),
            "workload": spec.workload.model_copy(update={"global_batch_size": samples}),
        }
    )


if __name__ == "__main__":
    sys.exit(main())
