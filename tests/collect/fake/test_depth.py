"""A deep stack's peak from three shallow traces (collect.fake.depth) is its whole trace's peak, for every strategy:
one process traces the plan at depths 3, 4, 5 and whole (the last of --depths), and the lines through the first three
must meet the fourth."""

import json
import subprocess
import sys

import pytest

from collect import REPO
from collect.fake.depth import DepthMismatch, extrapolate, sampled_depths, target_depth
from tests.conftest import tiny_spec

MOE = {"family": "moe", "experts": 4, "top_k": 2, "expert_ffn_hidden": 32, "first_dense_layers": 1, "ffn_hidden": 128}
PLANS = {  # (plan, workload, rank): a stack of 6 blocks per chunk (and a MoE model's dense one)
    "ddp": (dict(dp=2), {}, 0),
    "zero1": (dict(dp=2, sharding="zero1"), {}, 0),
    "fsdp_full, full recompute": (dict(dp=2, sharding="fsdp_full", recompute="full"), {}, 0),
    "fsdp_grad_op, selective recompute": (dict(dp=2, sharding="fsdp_grad_op", recompute="selective"), {}, 0),
    "tp 2 with sequence parallelism": (dict(tp=2, sequence_parallel=True, loss_parallel=True), {}, 0),
    "1f1b, last stage": (dict(pp=2, num_microbatches=4, pp_schedule="1f1b"), {}, 1),
    "interleaved": (dict(pp=2, num_microbatches=4, pp_schedule="interleaved_1f1b", virtual_stages=2), {}, 0),
    "moe, ep 2 under fsdp, a dense first layer": (dict(dp=2, ep=2, sharding="fsdp_full"), MOE, 0),
}


def _spec(name: str):
    plan, workload, rank = PLANS[name]
    stages = plan.get("pp", 1) * plan.get("virtual_stages", 1)
    depth = 6 + workload.get("first_dense_layers", 0)
    return tiny_spec(**plan, workload={**workload, "layers": stages * depth}), rank


@pytest.mark.parametrize("name", PLANS)
def test_the_extrapolated_peak_is_the_whole_trace(name):
    spec, rank = _spec(name)
    stage = rank // (spec.cluster.world_size // spec.plan.pp)
    depths, whole = sampled_depths(spec, stage), target_depth(spec, stage)
    assert depths is not None and whole > max(depths)
    command = [sys.executable, "-m", "collect.fake.trace", spec.model_dump_json(), "--rank", str(rank)]
    done = subprocess.run(
        [*command, "--depths", ",".join(map(str, (*depths, whole)))], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    *shallow, deep = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    peak, miss = extrapolate(spec, {t["depth"]: t["segments"] for t in shallow}, whole)
    exact = name != "zero1"  # ZeRO's greedy split of whole parameters moves a few hundred bytes with the depth
    assert peak == pytest.approx(deep["peak_mem_bytes"], rel=0 if exact else 1e-3, abs=0)
    assert miss == 0 or not exact


def test_a_segment_off_its_line_is_refused_and_the_whole_peak_alone_is_not_a_line():
    spec, _ = _spec("ddp")
    # the step's peak moves from the backward (slope 1) to the optimizer (slope 3) past depth 4: as segments, each
    # is on its line and the deep peak is the optimizer's; the whole peaks 12, 13, 16 are on none
    segments = {d: [["backward", 0, 0, d, 0, 9 + d], ["optimizer", 0, 3 * d + 1]] for d in (3, 4, 5)}
    assert extrapolate(spec, segments, 8) == (25, 0.0)
    segments[5][1][-1] += 100
    with pytest.raises(DepthMismatch, match="segment \\('optimizer', 0\\)"):
        extrapolate(spec, segments, 8)


def test_shallow_stacks_and_uneven_chunks_are_traced_whole():
    assert sampled_depths(tiny_spec(dp=2, workload={"layers": 5}), 0) is None
    uneven = tiny_spec(pp=2, num_microbatches=2, pp_schedule="interleaved_1f1b", virtual_stages=2,
                       workload={"layers": 30})  # fmt: skip
    assert uneven.plan.stage_layers(30) == (7, 8, 8, 7) and sampled_depths(uneven, 0) is None
