from collections import Counter

import numpy as np
import pytest
import yaml

from collect.__main__ import main as collect_main
from collect.active import ActiveLoop
from collect.schema import RunSpec
from collect.sweep import (
    SweepSpec,
    all_points,
    layouts,
    measurement_id,
    sample_points,
    schedule_measurements,
    valid_points,
)

SHAPES = [
    {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 256},
    {"layers": 4, "hidden": 96, "heads": 6, "seq_len": 32, "vocab": 256},
]


def _spec(**overrides) -> SweepSpec:
    return SweepSpec.model_validate({"name": "t", "shapes": SHAPES, "num_points": 90, "seed": 3, **overrides})


def test_layouts_cover_every_factorisation():
    assert sorted(layouts(4)) == [(1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
    assert all(pp * dp * tp == 8 for pp, dp, tp in layouts(8))


def test_sampled_points_are_all_valid_specs():
    for point in sample_points(_spec()):
        RunSpec.model_validate(point.model_dump())  # full validation, raises on any problem


def test_grid_is_every_valid_point_and_excludes_invalid_ones():
    spec = _spec(sampler="grid", world_sizes=[4])
    points = sample_points(spec)
    assert len(points) == len(valid_points(spec, 4)) > 0
    # heads = 6 cannot split over tp = 4; layers = 2 cannot give each of 2 x 2 interleaved stages a layer, which
    # the collector needs (collect_problems), so the sweeps draw the points they drew before uneven stages
    assert any(p.plan.tp == 4 for p in points)
    assert not any(p.workload.heads == 6 and p.plan.tp == 4 for p in points)
    assert not any(p.workload.layers == 2 and p.plan.virtual_stages == 2 for p in points)


def test_random_sampler_balances_world_sizes_and_varies_every_dimension():
    points = sample_points(_spec())
    assert Counter(p.cluster.world_size for p in points) == {1: 30, 2: 30, 4: 30}
    for field in ("sharding", "recompute"):
        assert len({getattr(p.plan, field) for p in points}) >= 3
    assert {p.plan.pp_schedule for p in points} >= {"gpipe", "1f1b", "interleaved_1f1b"}
    assert len({p.run_id for p in points}) == len(points)


def test_tp_degrees_filter():
    points = sample_points(_spec(tp_degrees=[1]))
    assert all(p.plan.tp == 1 for p in points)


def test_repeats_cover_ten_percent_three_times_each_spread_in_time():
    order = schedule_measurements(_spec(repeat_fraction=0.1, repeat_count=3))
    groups = Counter(group for _, _, group in order if group is not None)
    assert len(groups) == 9 and set(groups.values()) == {3}
    ids = [measurement_id(p, k) for p, k, _ in order]
    assert len(ids) == len(set(ids)) == 90 + 9 * 2
    for group in groups:
        repeat_indices = [k for p, k, g in order if g == group]
        assert repeat_indices[0] == 0 and sorted(repeat_indices) == [0, 1, 2]  # the first comes first


def test_repeats_in_rounds_measure_every_repeated_point_once_per_round():
    order = schedule_measurements(_spec(repeat_fraction=1.0, repeat_count=3, repeat_order="rounds"))
    n = len(order) // 3
    rounds = [order[k * n : (k + 1) * n] for k in range(3)]
    for k, measured in enumerate(rounds):
        assert {index for _, index, _ in measured} == {k}
        assert sorted(p.run_id for p, _, _ in measured) == sorted(p.run_id for p, _, _ in rounds[0])
    assert [p.run_id for p, _, _ in rounds[1]] != [p.run_id for p, _, _ in rounds[2]]  # a new order each round


def test_schedule_is_deterministic():
    a = [measurement_id(p, k) for p, k, _ in schedule_measurements(_spec())]
    b = [measurement_id(p, k) for p, k, _ in schedule_measurements(_spec())]
    assert a == b


def test_bad_sweep_field_is_named():
    with pytest.raises(ValueError, match="sampler"):
        _spec(sampler="sobolish")


# --- the active sampler's loop (collect.active.ActiveLoop) on a tiny pool, with a stub that reveals labels ---

ACTIVE = {"sampler": "active", "world_sizes": [1, 2], "check_runs": 6, "seed_runs": 4, "batch_size": 3}


def _true_time(p: RunSpec) -> float:
    w = p.workload
    return 1e-6 * w.layers * w.hidden * w.micro_batch_size * p.plan.num_microbatches / p.plan.dp + 1e-3 * p.plan.pp


class _Stub:
    """A surrogate that predicts the truth scaled by ``bias`` (spread: larger for larger plans); it records what it
    was fitted on."""

    def __init__(self, bias: float = 1.5):
        self.bias, self.fitted_on = bias, []

    def fit(self, points, log_times):
        assert len(points) == len(log_times)
        self.fitted_on.append({p.run_id for p in points})

    def predict(self, points):
        t = np.array([_true_time(p) for p in points])
        return np.log(self.bias * t), np.log1p(t * 1e3)


def _measure(point: RunSpec) -> dict:
    """What the sweep stores, as far as the loop reads it: one minute of wall time per device."""
    return {"run_id": point.run_id, "world_size": point.cluster.world_size, "wall_s": 60.0,
            "iter_time_s": _true_time(point), "status": "ok", "is_reference": False}  # fmt: skip


def _drive(loop: ActiveLoop, max_plans: int | None = None) -> list[tuple[str, str]]:
    measured = []
    while batch := loop.next_batch():
        for point, role in batch:
            if max_plans is not None and len(measured) == max_plans:
                return measured
            loop.add(_measure(point))
            measured.append((point.run_id, role))
    return measured


def test_active_loop_measures_check_then_seed_then_chosen_batches_within_the_budget():
    spec = _spec(**ACTIVE, budget_runs=13)
    stub = _Stub()
    loop = ActiveLoop(spec, all_points(spec), stub)
    measured = _drive(loop)
    roles = [role for _, role in measured]
    assert roles == ["check"] * 6 + ["seed"] * 4 + ["acquired"] * 9  # budget 13 = 4 seed + 3 batches of 3
    assert len({run_id for run_id, _ in measured}) == len(measured)  # nothing measured twice
    assert loop.runs == 13 and "budget" in loop.stopped_by
    assert all(not (fitted & loop.check_ids) for fitted in stub.fitted_on)  # the check set is never learned from
    assert loop.check_mape == pytest.approx(0.5)  # the stub's bias, read on the check set


def test_active_loop_stops_at_the_device_hour_budget_and_at_the_target():
    spec = _spec(**ACTIVE, budget_device_hours=0.5)
    loop = ActiveLoop(spec, all_points(spec), _Stub())
    _drive(loop)
    # each plan costs world_size minutes; the loop stops once 30 device-minutes are spent, not long after
    assert 0.5 <= loop.spent_hours <= 0.5 + 3 * 2 / 60
    perfect = ActiveLoop(_spec(**ACTIVE, budget_runs=100, target_mape=0.05), all_points(spec), _Stub(bias=1.0))
    measured = _drive(perfect)
    assert len(measured) == 10 and "target" in perfect.stopped_by  # check and seed, then the first fit is enough


def test_active_loop_resumes_from_its_rows_without_measuring_a_plan_twice():
    spec = _spec(**ACTIVE, budget_runs=13)
    first = ActiveLoop(spec, all_points(spec), _Stub())
    done = _drive(first, max_plans=12)  # stopped mid-batch
    rows = [_measure(next(p for p in all_points(spec) if p.run_id == run_id)) for run_id, _ in done]
    resumed = ActiveLoop(spec, all_points(spec), _Stub(), rows)
    more = _drive(resumed)
    assert {r for r, _ in done}.isdisjoint(r for r, _ in more)
    assert resumed.runs == 13 and len(done) + len(more) == 19
    assert resumed.finished and not ActiveLoop(spec, all_points(spec), None, rows).finished


def test_active_sampler_needs_a_budget_and_cannot_run_under_collect_alone(tmp_path, capsys):
    with pytest.raises(ValueError, match="budget_device_hours or budget_runs"):
        _spec(sampler="active")
    path = tmp_path / "active.yaml"
    path.write_text(yaml.safe_dump({"name": "a", "shapes": SHAPES, **ACTIVE, "budget_runs": 4}))
    with pytest.raises(SystemExit) as exit_:
        collect_main(["sweep", str(path)])
    assert exit_.value.code == 2 and "python -m gnn.acquire" in capsys.readouterr().err
