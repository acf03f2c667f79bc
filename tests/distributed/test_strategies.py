"""Every strategy family really runs on gloo ranks and reports finite time and sane memory."""

import math

import pytest

from collect.launch.pool import LocalPool
from collect.measure.plan import MeasureSettings
from tests.conftest import tiny_spec

pytestmark = pytest.mark.distributed
SETTINGS = MeasureSettings(warmup_iters=1, timed_iters=2)

TWO_RANK_PLANS = {
    "ddp": dict(dp=2),
    "zero1": dict(dp=2, sharding="zero1"),
    "fsdp_grad_op": dict(dp=2, sharding="fsdp_grad_op"),
    "fsdp_full": dict(dp=2, sharding="fsdp_full"),
    "tp": dict(tp=2),
    "tp_sequence_parallel": dict(tp=2, sequence_parallel=True),
    "tp_loss_parallel": dict(tp=2, sequence_parallel=True, loss_parallel=True),
    "pp_gpipe": dict(pp=2, pp_schedule="gpipe", num_microbatches=2),
    "pp_1f1b": dict(pp=2, pp_schedule="1f1b", num_microbatches=2),
    "pp_interleaved_1f1b": dict(pp=2, pp_schedule="interleaved_1f1b", virtual_stages=2, num_microbatches=2),
    "recompute_full": dict(dp=2, recompute="full"),
    "recompute_selective": dict(dp=2, recompute="selective", num_microbatches=2),
}
FOUR_RANK_PLANS = {
    "dp_tp_fsdp": dict(dp=2, tp=2, sharding="fsdp_full"),
    "pp_dp_ddp": dict(pp=2, dp=2, num_microbatches=2),
    "pp_dp_zero1": dict(pp=2, dp=2, sharding="zero1", num_microbatches=2),
    "pp_tp_interleaved_recompute": dict(
        pp=2,
        tp=2,
        pp_schedule="interleaved_1f1b",
        virtual_stages=2,
        num_microbatches=2,
        recompute="full",
        sequence_parallel=True,
    ),
}


@pytest.fixture(scope="module")
def pools():
    with LocalPool(2, SETTINGS, deadline_s=120) as two, LocalPool(4, SETTINGS, deadline_s=180) as four:
        yield {2: two, 4: four}


def _check(result, spec):
    assert result.status == "ok", result.error
    assert math.isfinite(result.iter_time_s) and result.iter_time_s > 0
    assert len(result.iter_times_s) == SETTINGS.timed_iters
    assert len(result.peak_mem_bytes_per_rank) == spec.cluster.world_size
    # sane: at least this rank's share of parameters (4 bytes each), at most 100x all state
    model_bytes = 4 * spec.workload.num_params
    assert min(result.peak_mem_bytes_per_rank) >= model_bytes / spec.cluster.world_size
    assert result.peak_mem_bytes <= 100 * 4 * model_bytes
    print(
        f"{spec.plan.model_dump(exclude_defaults=True)}: {result.iter_time_s * 1e3:.1f} ms, "
        f"peak {result.peak_mem_bytes / 2**20:.2f} MiB"
    )


@pytest.mark.parametrize("name", TWO_RANK_PLANS)
def test_two_rank_strategy(pools, name):
    spec = tiny_spec(**TWO_RANK_PLANS[name])
    _check(pools[2].run(spec), spec)


@pytest.mark.parametrize("name", FOUR_RANK_PLANS)
def test_four_rank_composition(pools, name):
    spec = tiny_spec(**FOUR_RANK_PLANS[name])
    _check(pools[4].run(spec), spec)


def test_sharding_reduces_memory(pools):
    """FSDP's point, measured: a parameter-heavy model's peak drops under full sharding.

    4 layers, not 2: FSDP gathers one block at a time, and with 2 blocks that gathered
    block is so large a share of the peak that the ratio ranged 0.67-0.80 between runs
    (0.61-0.65 with 4), too close to the bound."""
    wide = {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 8, "micro_batch_size": 1}
    ddp = pools[2].run(tiny_spec(dp=2, workload=wide))
    fsdp = pools[2].run(tiny_spec(dp=2, sharding="fsdp_full", workload=wide))
    assert ddp.status == fsdp.status == "ok"
    assert fsdp.peak_mem_bytes < 0.8 * ddp.peak_mem_bytes


def test_three_d_plan_on_eight_ranks():
    """pp x dp x tp all > 1 needs 8 ranks: 8 processes on this machine's cores, about a minute."""
    spec = tiny_spec(pp=2, dp=2, tp=2, num_microbatches=2, sharding="fsdp_grad_op")
    with LocalPool(8, SETTINGS, deadline_s=300) as pool:
        _check(pool.run(spec), spec)


@pytest.mark.parametrize(
    "sharding,tolerance", [("none", 0.05), ("zero1", 0.05), ("fsdp_grad_op", 0.2), ("fsdp_full", 0.2)]
)
def test_simulated_peak_matches_two_rank_measurement(pools, sharding, tolerance):
    """The execution graph's memory model against the measured peak of each data-parallel family on 2 ranks.

    Measured here: DDP 70.7 MB and ZeRO-1 58.0 MB in every run; FSDP moves between runs and ranks (grad_op 47-52,
    full 43-49 MB), hence the wider bound. Simulated: 70.7, 57.0, 42.1 and 41.8 MB (42.6 and 42.1 while FSDP's
    root unit was averaged into its blocks; 43.0 and 42.7 while attention scores were charged). Before DDP's gradient
    buckets, FSDP2's kept and prefetched blocks and gradients written during the backward were modelled, it
    simulated 61.7, 46.4, 32.7 and 35.9 MB."""
    from gnn.costs.hardware import hardware_model
    from gnn.sim.plan import simulate_plan

    wide = {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 32, "vocab": 512, "micro_batch_size": 2}
    spec = tiny_spec(dp=2, sharding=sharding, workload=wide)
    hw = hardware_model("a100-80gb", "data/hardware")  # memory does not depend on the device's speed
    _, sim = simulate_plan(spec.workload, spec.plan, spec.cluster, hw)
    # NOTE: on a loaded machine the DDP plan read exactly 84.4 MB instead of 70.7 MB (2 of 3 runs beside two
    # busy processes): one more copy of the gradients (13.7 MB), a bucket's all-reduce still holding its buffer
    # when the peak comes. Such timing only ever adds, so up to three readings are taken and the lowest, the
    # unhurried schedule the simulator models, is compared.
    readings = []
    for _ in range(3):
        measured = pools[2].run(spec)
        assert measured.status == "ok", measured.error
        readings.append(measured.peak_mem_bytes)
        if sim.peak_mem_bytes == pytest.approx(min(readings), rel=tolerance):
            break
    assert sim.peak_mem_bytes == pytest.approx(min(readings), rel=tolerance)


def test_uneven_pipeline_stages_run_and_are_simulated_per_rank(pools):
    """3 layers on 2 stages split [2, 1] (Plan.stage_layers): the collector builds them, and the first rank, with
    two blocks' weights, gradients and Adam moments, peaks well above the second, in the simulator too."""
    from gnn.costs.hardware import hardware_model
    from gnn.sim.plan import simulate_plan

    wide = {"layers": 3, "hidden": 256, "heads": 4, "seq_len": 8, "vocab": 128, "micro_batch_size": 1}
    spec = tiny_spec(pp=2, num_microbatches=2, workload=wide)
    assert spec.plan.stage_layers(3) == (2, 1)
    result = pools[2].run(spec)
    _check(result, spec)
    first, second = result.peak_mem_bytes_per_rank
    assert first > 1.5 * second
    _, sim = simulate_plan(spec.workload, spec.plan, spec.cluster, hardware_model("a100-80gb", "data/hardware"))
    for simulated, measured in zip(sim.peak_mem_per_rank, result.peak_mem_bytes_per_rank):
        assert simulated == pytest.approx(measured, rel=0.05)  # 27.94 and 15.31 MB against 27.95 and 15.29


def test_a_pipeline_that_keeps_only_the_loss_frees_each_output_at_its_backward(pools):
    """Megatron's convention (plan.pipeline_keeps_outputs False, torch's step(return_outputs=False)) against the
    collector's default, on 1F1B's last stage: measured 14.3 against 38.8 MB; the graph drops the kept outputs too
    (12.3 against 29.1 MB simulated)."""
    from gnn.costs.hardware import hardware_model
    from gnn.sim.plan import simulate_plan

    w = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64, "vocab": 4096, "micro_batch_size": 2}
    peaks, simulated = [], []
    for keep in (True, False):
        spec = tiny_spec(pp=2, num_microbatches=8, pipeline_keeps_outputs=keep, workload=w)
        result = pools[2].run(spec)
        assert result.status == "ok", result.error
        peaks.append(result.peak_mem_bytes_per_rank[-1])
        hw = hardware_model("a100-80gb", "data/hardware")
        simulated.append(simulate_plan(spec.workload, spec.plan, spec.cluster, hw)[1].peak_mem_per_rank[-1])
    assert peaks[1] < 0.6 * peaks[0] and simulated[1] < 0.6 * simulated[0]


def test_a_vocabulary_parallel_loss_keeps_a_shard_of_the_logits(pools):
    """torchtitan's loss_parallel (plan.loss_parallel): the head's logits stay sharded over the vocabulary and the
    loss reads them so. The loss's fp32 tensors (the logits, their log-softmax, its gradient: 4 MiB each whole here)
    are halved on each of 2 ranks: 20.26 MB measured without, 16.07 MB with."""
    w = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64, "vocab": 8192, "micro_batch_size": 2}
    peaks = {}
    for loss_parallel in (False, True):
        spec = tiny_spec(tp=2, loss_parallel=loss_parallel, workload=w)
        result = pools[2].run(spec)
        assert result.status == "ok", result.error
        peaks[loss_parallel] = result.peak_mem_bytes_per_rank[0]
    assert peaks[True] < peaks[False] - 3 * 2**20
