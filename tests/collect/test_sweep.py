from collections import Counter

import pytest

from collect.schema import RunSpec
from collect.sweep import SweepSpec, layouts, measurement_id, sample_points, schedule_measurements, valid_points

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
