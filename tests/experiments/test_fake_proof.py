"""The fake-vs-real proof's summary: each traced rank against its re-measurements, by their median and lowest."""

import pytest

from experiments.memory.fake import compared_again

STRATA = {"family": "moe", "sharding": "fsdp_full", "recompute": "none", "pipelined": True,
          "tensor_parallel": False, "expert_parallel": True}  # fmt: skip


def _plan(run_id: str, *traced: int) -> dict:
    ranks = [{"rank": i, "measured": 100, "peak_mem_bytes": t, "cpu_s": 1.0} for i, t in enumerate(traced)]
    return {"run_id": run_id, **STRATA, "ranks": ranks}


def test_a_rank_is_compared_with_the_median_and_the_lowest_of_its_runs():
    again = {"a": [[100, 100], [125, 100], [125, 100]]}
    report = compared_again([_plan("a", 100, 100)], again, "in_place")
    assert report["ranks"] == 2 and report["max_abs_error"] == pytest.approx(1 - 100 / 125)  # the median, 125
    assert report["lowest"]["max_abs_error"] == 0.0
    assert "failed" not in report["lowest"]


def test_a_plan_never_measured_again_is_left_out():
    report = compared_again([_plan("a", 100), _plan("b", 50)], {"a": [[104]]}, "remeasured")
    assert report["traced"] == 1 and report["max_abs_error"] == pytest.approx(1 - 100 / 104)
