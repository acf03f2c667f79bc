"""The acquisition strategies (collect.active) and the simulated collection loop on a tiny pool."""

import numpy as np
import pandas as pd
import pytest

from collect.active import device_hours, may_be_fastest, select_batch
from experiments.active.replay import hours_to_reach, on_grid, run


def test_device_hours_count_every_device_for_start_up_and_steps():
    assert device_hours(np.array([8]), np.array([2.0]), 120.0, 6)[0] == pytest.approx(8 * (120 + 12) / 3600)


def test_uncertainty_takes_the_widest_and_active_prefers_the_cheap_and_spreads_over_groups():
    mean = np.zeros(4)
    spread = np.array([1.0, 0.9, 0.8, 0.1])
    cost = np.array([100.0, 1.0, 1.0, 1.0])
    groups = np.array(["a", "a", "a", "b"])
    rng = np.random.default_rng(0)
    assert list(select_batch("uncertainty", 2, mean, spread, cost, groups, rng)) == [0, 1]
    # the widest is 100x the cost: active skips it; its second pick leaves group a for b only if a's halved
    # score falls below b's: 0.8 / 2 = 0.4 > 0.1, so it stays in a
    assert list(select_batch("active", 2, mean, spread, cost, groups, rng)) == [1, 2]
    assert list(select_batch("active", 2, mean, spread, cost, np.array(["a", "a", "b", "c"]), rng)) == [1, 2]
    with pytest.raises(ValueError, match="strategy"):
        select_batch("greedy", 1, mean, spread, cost, groups, rng)


def test_a_plan_may_be_fastest_when_its_optimistic_time_beats_its_groups_best():
    mean = np.array([0.0, 0.5, 2.0])
    spread = np.array([0.1, 0.6, 0.1])
    assert list(may_be_fastest(mean, spread, np.array(["g", "g", "g"]))) == [True, True, False]


def _tiny_pool(n=120, seed=0) -> pd.DataFrame:
    """A pool whose labels a stub reveals: the 'measured' time is the simulated one times a factor that depends
    on one feature, so a learner that sees enough plans corrects it."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, n)
    sim = rng.uniform(1, 10, n)
    return pd.DataFrame(
        {
            "run_id": [f"r{i}" for i in range(n)],
            "f_x": x,
            "sim_time_s": sim,
            "iter_time_s": sim * np.exp(2 * x),
            "cost_h": rng.uniform(0.1, 1.0, n),
            "group": rng.choice(["a", "b", "c"], n),
        }
    )


@pytest.mark.parametrize("strategy", ["random", "uncertainty", "active"])
def test_the_loop_reveals_batches_and_learns(strategy):
    rows = _tiny_pool()
    curve = run(rows, strategy, seed=0, batch=8, budget_h=None if strategy == "random" else 20.0, rounds=6)
    hours, mape = np.array(curve).T
    assert np.all(np.diff(hours) > 0)  # every batch costs
    assert mape[-1] < mape[0]  # revealing labels helps
    grid = np.linspace(hours[0], hours[-1], 5)
    assert not np.isnan(on_grid(curve, grid)).any()
    assert hours_to_reach(grid, on_grid(curve, grid), mape[-1]) <= hours[-1]
