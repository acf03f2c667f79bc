"""The token embedding's gradient, in the simulator, against fake traces of the collector's own code
(collect.fake.trace, torch 2.13): DTensor's embedding backward has no strategy sharded over the vocabulary, so under
tensor parallelism every rank makes a Partial gradient of the whole table (1,002 MiB for Llama 3.1 8B's, not its
125 MiB shard at tp 8), and a pipelined FSDP stage accumulates it so to its last micro-batch, each micro-batch's new
one made beside it.

The plans: Llama 3.1 8B's shape at sequence 2,048, micro-batch 2, two pipeline stages, FSDP (fsdp_full) over 256 data
ranks, full recompute, on H100s (the first stage of fake-full-v1's 9c9f7829, whose traced peak the simulator missed
by 42%, cut short). Traced at rank 0, the first stage."""

import pytest

from collect import REPO
from collect.schema import RunSpec
from gnn.costs.hardware import hardware_model
from gnn.sim.plan import simulate_plan

H100 = hardware_model("h100-80gb", str(REPO / "data" / "hardware"))
LLAMA_8B_SHORT = dict(family="llama", hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
                      seq_len=2048, micro_batch_size=2, dtype="bfloat16")  # fmt: skip
PLAN = dict(dp=256, tp=8, pp=2, sequence_parallel=True, sharding="fsdp_full", recompute="full", pp_schedule="1f1b")
GIB = 2**30


def _first_rank_peak(layers: int, microbatches: int, **plan) -> float:
    world = plan["dp"] * plan["tp"] * plan["pp"]
    cluster = dict(nodes=world // 8, devices_per_node=8, device="cuda", device_kind="h100", memory_bytes=80 * GIB,
                   backend="nccl")  # fmt: skip
    workload = dict(LLAMA_8B_SHORT, layers=layers, global_batch_size=plan["dp"] * 2 * microbatches)
    plan = {**plan, "num_microbatches": microbatches}
    spec = RunSpec.model_validate({"workload": workload, "plan": plan, "cluster": cluster})
    return simulate_plan(spec.workload, spec.plan, spec.cluster, H100)[1].peak_mem_per_rank[0]


@pytest.mark.parametrize(
    ("plan", "traced_gib"),
    [
        (PLAN, 2.3847),  # the simulator held 0.587 GiB before: the embedding's gradient as a tp shard, made once
        ({**PLAN, "sequence_parallel": False}, 2.6035),
        ({**PLAN, "tp": 2}, 3.4589),  # the whole gradient does not shrink with tp; the shards of the rest do
    ],
    ids=["tp8-sp", "tp8", "tp2-sp"],
)
def test_the_first_stage_accumulates_the_whole_embedding_gradient_and_makes_each_new_one_beside_it(plan, traced_gib):
    """At the first stage's peak, its embedding backward of a later micro-batch: two whole gradients (the
    accumulated one and the new one) beside the blocks' unsharded gradients and their units, still gathered, and
    the hidden state's gradient arriving."""
    assert _first_rank_peak(**plan, layers=4, microbatches=4) == pytest.approx(traced_gib * GIB, rel=0.03)


def test_a_pipelined_fsdp_stage_reduces_only_when_the_step_begins_with_every_unit_still_gathered():
    """torch's pipelining runs every backward, the last too, without FSDP's gradient sync or resharding, and reduces
    group by group once the schedule ends (PipelineStage.perform_reduce_grad): GPipe with one micro-batch, two
    stages of 4 layers at tp 2, peaks as the step reduces its first group, the embedding's, with every unsharded
    gradient, every unit gathered and the embedding's tp shard made from its whole gradient. Traced: 3.663 GiB (the
    simulator held 2.329 before: its gradients reduced as they were made, its units resharded)."""
    plan = {**PLAN, "tp": 2, "sequence_parallel": False, "pp_schedule": "gpipe"}
    assert _first_rank_peak(**plan, layers=8, microbatches=1) == pytest.approx(3.6629 * GIB, rel=0.03)
