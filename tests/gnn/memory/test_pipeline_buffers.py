"""What torch's pipelining holds per micro-batch, in the simulator, against fake traces of the collector's own code
(collect.fake.trace --microbatches, torch 2.13): Llama 3.1 8B at sequence 32k, micro-batch 2, full recompute, on 512
H100 ranks. Each extra micro-batch adds the same bytes past the warm-up, so the figures are slopes."""

import pytest

from collect import REPO
from collect.fake.trace import with_microbatches
from collect.schema import RunSpec
from gnn.costs.hardware import hardware_model
from gnn.sim.plan import simulate_plan

H100 = hardware_model("h100-80gb", str(REPO / "data" / "hardware"))
LLAMA_8B_32K = dict(family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
                    seq_len=32768, micro_batch_size=2, dtype="bfloat16")  # fmt: skip
CLUSTER = dict(nodes=64, devices_per_node=8, device="cuda", device_kind="h100", memory_bytes=80 * 2**30, backend="nccl")
GB = 1e9


def _slope(plan: dict, rank: int, counts: tuple[int, int]) -> float:
    """Bytes a rank's simulated peak grows by per micro-batch between two counts."""
    spec = RunSpec.model_validate(
        {"workload": dict(LLAMA_8B_32K, global_batch_size=plan["dp"] * 2 * 16), "plan": plan, "cluster": CLUSTER}
    )
    peaks = []
    for count in counts:
        s = with_microbatches(spec, count)
        peaks.append(simulate_plan(s.workload, s.plan, s.cluster, H100)[1].peak_mem_per_rank[rank])
    return (peaks[1] - peaks[0]) / (counts[1] - counts[0])


def test_the_interleaved_schedule_holds_every_sent_output_to_the_step_end():
    """torch's interleaved schedule (_PipelineScheduleRuntime) waits its sends only when the step ends: the first
    rank's two stages hold six activations per micro-batch (their outputs, both receive buffers' gradients, the
    second stage's receive buffer and its input's gradient). Traced: 72.79, 98.57 and 124.34 GB at 16, 24 and 32
    micro-batches, 3.22 GB each (0.54 GB an activation)."""
    plan = dict(dp=8, tp=8, pp=8, sharding="fsdp_grad_op", recompute="full", pp_schedule="interleaved_1f1b",
                virtual_stages=2, num_microbatches=16)  # fmt: skip
    assert _slope(plan, 0, (16, 32)) == pytest.approx(3.222 * GB, rel=0.02)


def test_the_last_stage_merges_its_kept_outputs_beside_them():
    """schedule.step(return_outputs=True), the collector's default as torch's, keeps each micro-batch's logits
    (bf16) and concatenates them when the step ends: two copies of every output at once on the last rank. Traced:
    273.48 and 546.75 GB at 8 and 16 micro-batches, 34.16 GB each (16.8 GB of logits)."""
    plan = dict(dp=64, pp=8, sharding="fsdp_grad_op", recompute="full", pp_schedule="1f1b", num_microbatches=16)
    assert _slope(plan, 7, (8, 16)) == pytest.approx(34.16 * GB, rel=0.02)


def test_1f1b_holds_two_sequence_shards_per_microbatch():
    """Under sequence parallelism a stage sends and receives its tp rank's sequence shard of the hidden state, and
    1F1B waits each backward send before its next forward: a middle rank holds per micro-batch only its two receive
    buffers (the input's, the output gradient's), 67 MB each at tp 8. Traced at rank 192: 7.39 and 9.54 GB at 16
    and 32 micro-batches, 0.1347 GB each (the simulator held three whole hidden states, 1.61 GB, before)."""
    plan = dict(dp=8, tp=8, pp=8, sequence_parallel=True, sharding="fsdp_grad_op", recompute="full",
                pp_schedule="1f1b", num_microbatches=16)  # fmt: skip
    assert _slope(plan, 3, (16, 32)) == pytest.approx(0.1347 * GB, rel=0.02)


def test_the_sends_an_interleaved_schedule_waits_are_freed_before_the_merge():
    """The interleaved schedule frees what its sends held when it ends, before the last stage merges its kept
    outputs: at the merge the last rank holds per micro-batch two copies of the logits and its three receive
    buffers, not also its three sends. Traced at rank 448: 282.07 and 563.93 GB at 8 and 16 micro-batches, 35.233 GB
    each (36.84 GB before)."""
    plan = dict(dp=64, pp=8, sharding="fsdp_grad_op", recompute="full", pp_schedule="interleaved_1f1b",
                virtual_stages=2, num_microbatches=16)  # fmt: skip
    assert _slope(plan, 7, (8, 16)) == pytest.approx(35.233 * GB, rel=0.01)
