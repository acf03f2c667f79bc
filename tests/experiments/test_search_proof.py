"""The search proof's judging: confirmed plans by their rounds alone, the rest by their one sweep reading."""

import pandas as pd
import pytest

from experiments.proof_runs import judged, round_scatter


def _rows(readings: list[tuple[str, str, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"run_id": run_id, "status": status, "iter_time_s": t, "is_reference": False}
            for run_id, status, t in readings
        ]
    )


def test_a_confirmed_plan_is_judged_on_its_rounds_not_its_lucky_sweep_reading():
    swept = _rows([("lucky", "ok", 0.100), ("steady", "ok", 0.130), ("slow", "ok", 0.300), ("big", "oom", 0.0)])
    confirmed = _rows(
        [("lucky", "ok", t) for t in (0.180, 0.170, 0.190)] + [("steady", "ok", t) for t in (0.140, 0.150, 0.145)]
    )
    per_plan = judged(swept, confirmed)
    assert per_plan.loc["lucky", "time"] == pytest.approx(0.180)
    assert per_plan.loc["steady", "time"] == pytest.approx(0.145)
    assert per_plan["time"].idxmin() == "steady"
    assert per_plan.loc["slow", "measurements"] == 1 and per_plan.loc["lucky", "measurements"] == 3
    assert per_plan.loc["big", "status"] == "oom"


def test_round_scatter_is_the_median_coefficient_of_variation():
    confirmed = _rows(
        [("a", "ok", t) for t in (1.0, 1.0, 1.0)]
        + [("b", "ok", t) for t in (1.0, 2.0, 3.0)]
        + [("c", "ok", t) for t in (2.0, 2.0, 2.0)]
        + [("c", "oom", 0.0)]
    )
    assert round_scatter(confirmed) == pytest.approx(0.0)
    assert round_scatter(confirmed[confirmed.run_id == "b"]) == pytest.approx(0.5)
