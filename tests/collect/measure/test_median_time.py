"""A compute point stops repeating once its time budget is spent, never below a few samples."""

import time

import pytest
import torch

from collect.measure.blocks import MIN_BUDGET_REPEATS, median_time

CPU = torch.device("cpu")


def _counting(seconds: float):
    calls = []

    def fn():
        calls.append(1)
        time.sleep(seconds)

    return fn, calls


def test_a_slow_point_stops_at_its_budget_after_the_fewest_samples():
    fn, calls = _counting(0.02)
    median_time(fn, CPU, repeats=15, warmups=1, budget_s=0.01)
    assert len(calls) == 1 + MIN_BUDGET_REPEATS


def test_without_a_budget_every_repeat_runs():
    fn, calls = _counting(0.0)
    median_time(fn, CPU, repeats=7, warmups=2)
    assert len(calls) == 9


def test_ranks_that_start_together_cannot_stop_apart():
    with pytest.raises(ValueError, match="budget_s"):
        median_time(lambda: None, CPU, repeats=3, barrier=True, budget_s=1.0)
