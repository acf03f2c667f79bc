"""Fits/failed accuracy counts a failed run as one that does not fit."""

import pandas as pd
import pytest

from experiments.gpu_fits import accuracy, check_sets


def test_a_failed_run_predicted_to_fit_counts_as_wrong():
    runs = pd.DataFrame({"status": ["ok", "ok", "failed", "failed"]})
    fits = pd.Series([True, False, True, False])
    got = accuracy(fits, runs)
    assert got["accuracy"] == pytest.approx(0.5)
    assert got["finished_predicted_to_fit"] == pytest.approx(0.5)
    assert got["failed_predicted_not_to_fit"] == pytest.approx(0.5)


def test_held_out_sets_take_failed_runs_of_the_largest_model_and_scale():
    runs = pd.DataFrame(
        {
            "run_id": ["a", "b", "c", "d"],
            "status": ["ok", "failed", "failed", "ok"],
            "num_params": [1e9, 8e10, 1e9, 8e10],
            "world_size": [8, 8, 256, 64],
        }
    )
    sets = check_sets(runs)
    assert list(sets["h100/held_out_size"]) == [False, True, False, True]
    assert list(sets["h100/held_out_scale"]) == [False, False, True, False]


def test_a_pick_is_the_fastest_allowed_plan_and_a_failed_one_has_no_regret():
    from experiments.picks import pick, summary

    group = pd.DataFrame(
        {"status": ["ok", "ok", "failed"], "iter_time_s": [10.0, 12.0, None], "pred_time_s": [11.0, 9.0, 5.0]}
    )
    risky = pick(group, pd.Series([True, True, True]))  # the failed plan predicted fastest: picked, and failed
    assert risky["failed"] and risky["regret"] is None
    safe = pick(group, pd.Series([True, True, False]))  # without it: the 12 s plan, 20% slower than the best
    assert not safe["failed"] and safe["regret"] == pytest.approx(0.2)
    none = pick(group, pd.Series([False, False, False]))
    assert not none["picked"]
    got = summary([risky, safe, none])
    assert got == {
        "groups": 3,
        "picked": 2,
        "failed_picks": 1,
        "median_regret": pytest.approx(0.2),
        "mean_regret": pytest.approx(0.2),
        "within_10pct": 0.0,
    }
