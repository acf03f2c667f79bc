"""A pipeline stage's parameters are those of the layers it holds: where dense and MoE layers mix (DeepSeek-V3's
first 3 dense, Qwen's MoE every other layer), a stage is not its layer count times the model's average layer
(b1301767, DeepSeek-V3 over 8 GPipe stages: its first stage, 3 dense layers and 4 MoE ones, was simulated 32% over
its trace as 7 average layers, and each middle stage 6.5% under)."""

import pytest
import torch

from collect.schema import Cluster, Plan, Workload
from collect.workloads.llama import Llama
from gnn.costs.hardware import hardware_model
from gnn.graph.passes import PassCompiler

SHAPE = dict(family="moe", hidden=64, heads=4, kv_heads=2, ffn_hidden=256, vocab=512, experts=8, top_k=2,
             expert_ffn_hidden=32, seq_len=16, micro_batch_size=1, global_batch_size=1)  # fmt: skip


def _stage_counts(model: Llama, stage_layers: tuple[int, ...]) -> list[int]:
    """Parameters of each stage of the collector's own model, split as the plan splits it."""
    per_layer = [sum(p.numel() for p in layer.parameters()) for layer in model.layers.values()]
    counts, start = [], 0
    for s, n in enumerate(stage_layers):
        count = sum(per_layer[start : start + n])
        count += model.embeddings.tok.weight.numel() if s == 0 else 0
        count += model.output.weight.numel() + model.norm.weight.numel() if s == len(stage_layers) - 1 else 0
        counts.append(count)
        start += n
    return counts


@pytest.mark.parametrize(
    "layers, first_dense, every, pp",
    [(10, 3, 1, 2), (10, 3, 1, 4), (12, 0, 2, 3), (9, 1, 2, 2)],
    ids=["deepseek-like pp 2", "deepseek-like pp 4, uneven", "every other layer pp 3", "both pp 2"],
)
def test_each_stage_holds_the_parameters_of_its_own_layers(layers, first_dense, every, pp):
    w = Workload(**SHAPE, layers=layers, first_dense_layers=first_dense, moe_every=every)
    plan = Plan(pp=pp, num_microbatches=pp)
    with torch.device("meta"):
        model = Llama(w)
    cluster = Cluster(devices_per_node=pp, device="cuda", device_kind="h100", backend="nccl", memory_bytes=2**36)
    memory = PassCompiler(w, plan, cluster, hardware_model("h100-80gb")).memory
    stages = plan.stage_layers(w.layers, w.pipeline_costs)
    assert [memory.params(s) for s in range(pp)] == pytest.approx(_stage_counts(model, stages), rel=1e-9)
    experts = [sum(p.numel() for n, p in model.named_parameters() if ".experts." in n and f"layers.{i}." in n)
               for i in range(layers)]  # fmt: skip
    first = sum(experts[: stages[0]])
    assert memory.expert_params(0) == first
