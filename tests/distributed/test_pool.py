"""Failures are data: oom labels, errors and hangs are recorded and the pool carries on."""

import pytest

from collect.launch.pool import LocalPool
from collect.measure.plan import MeasureSettings
from collect.schema import RunSpec
from tests.conftest import tiny_spec

pytestmark = pytest.mark.distributed
SETTINGS = MeasureSettings(warmup_iters=0, timed_iters=2)


def test_plan_over_capacity_is_labelled_oom_with_its_measurements():
    spec = tiny_spec(dp=2, memory_bytes=1024)
    with LocalPool(2, SETTINGS, deadline_s=120) as pool:
        result = pool.run(spec)
    assert result.status == "oom"
    assert "> cluster.memory_bytes 1024" in result.error
    assert result.iter_time_s > 0 and result.peak_mem_bytes > 1024


def test_pool_recovers_after_failing_and_hung_plans():
    good = tiny_spec(dp=2)
    # Bypass validation the way a corrupted task would: 3 heads cannot split over tp=2,
    # so every rank fails inside the worker and the pool must restart.
    bad = RunSpec.model_construct(
        workload=good.workload.model_copy(update={"heads": 3, "hidden": 63}),
        plan=good.plan.model_copy(update={"dp": 1, "tp": 2}),
        cluster=good.cluster,
    )
    with LocalPool(2, SETTINGS, deadline_s=120) as pool:
        assert pool.run(good).status == "ok"
        failed = pool.run(bad)
        assert failed.status == "error" and "rank" in failed.error
        assert pool.restarts == 1
        assert pool.run(good).status == "ok"
        pool.deadline_s = 0.05  # nothing finishes in 50 ms: a hang, as far as the pool can tell
        hung = pool.run(good)
        assert hung.status == "timeout" and "no result within" in hung.error
        assert pool.restarts == 2
        pool.deadline_s = 120
        assert pool.run(good).status == "ok"
