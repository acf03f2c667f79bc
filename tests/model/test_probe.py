"""A probe's correction (gnn.inference.probe): the shift it takes from runs, how sure it is, what it does to
intervals, and the sittings prior it starts from; the probe plans collect.probe runs."""

import math

import numpy as np
import pandas as pd
import pytest

from collect.inputs import InputError
from collect.probe import cuda_points, probe_spec
from collect.schema import plan_problems
from gnn.inference.probe import MachineCorrection, load_probe, probe_path, shift_prior

COLUMNS = {
    "iter_time_s": np.array([1.0, 2.0]),
    "iter_time_lo_s": np.array([0.8, 1.5]),
    "iter_time_hi_s": np.array([1.25, 2.5]),
}


def _fit(residuals, world_sizes, prior=(0.1, 0.0, 0.1)) -> MachineCorrection:
    return MachineCorrection(tuple(np.log(residuals)), tuple(world_sizes), prior)


def test_more_runs_move_further_and_doubt_less():
    one, three, ten = (_fit([1.2] * n, [1] * n) for n in (1, 3, 10))
    (m1, s1), (m3, s3), (m10, s10) = (c.shift([1]) for c in (one, three, ten))
    assert 0 < m1[0] < m3[0] < m10[0] < math.log(1.2)
    assert s1[0] > s3[0] > s10[0]
    # one shared shift, tau = sigma: the runs' mean shrunk by n / (n + 1), its sd sigma / sqrt(n + 1)
    assert m10[0] == pytest.approx(math.log(1.2) * 10 / 11) and s10[0] == pytest.approx(0.1 / math.sqrt(11))


def test_a_world_size_the_probe_ran_moves_more_than_one_it_did_not():
    c = _fit([1.5, 1.0, 1.0], [1, 2, 4], prior=(0.1, 0.2, 0.05))
    mean, sd = c.shift([1, 2, 8])
    assert mean[0] > mean[1] and mean[0] > mean[2] > 0  # the ws-1 run's shift is its own; ws 8 gets the common part
    assert sd[2] > sd[0]


def test_without_a_prior_the_runs_decide():
    c = _fit([1.1, 1.3], [2, 2], prior=(float("nan"), float("nan"), 0.01))
    assert math.exp(c.shift([2])[0][0]) == pytest.approx(math.exp(np.log([1.1, 1.3]).mean()), rel=1e-3)
    none = MachineCorrection((), (), (float("nan"), float("nan"), 0.2))
    assert none.runs == 0 and none.shift([4])[0][0] == 0


def test_apply_moves_the_point_and_widens_both_sides():
    c = _fit([1.5] * 10, [2] * 10, prior=(1.0, 0.0, 0.01))
    out = c.apply(COLUMNS, 2)
    assert out["iter_time_s"] == pytest.approx(COLUMNS["iter_time_s"] * 1.5, rel=1e-3)
    below = np.log(out["iter_time_s"] / out["iter_time_lo_s"])
    above = np.log(out["iter_time_hi_s"] / out["iter_time_s"])
    assert np.all(below > np.log(COLUMNS["iter_time_s"] / COLUMNS["iter_time_lo_s"]))
    assert np.all(above > np.log(COLUMNS["iter_time_hi_s"] / COLUMNS["iter_time_s"]))
    assert COLUMNS["iter_time_s"][0] == 1.0  # the caller's columns are left as they were
    assert c.summary(2)["runs"] == 10 and c.summary(2)["time_factor"] == pytest.approx(1.5, rel=1e-3)


def _sittings(shifts: dict[str, float], plans: int = 12, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for fingerprint, shift in shifts.items():
        for p in range(plans):
            t = (1 + p) * math.exp(shift + (0.1 if fingerprint == "b" and p % 2 else 0) + rng.normal(0, 0.05))
            rows.append({"run_id": f"plan{p}", "fingerprint_id": fingerprint, "iter_time_s": t, "status": "ok",
                         "device": "cpu", "world_size": 1 + p % 2})  # fmt: skip
    return pd.DataFrame(rows)


def test_shift_prior_reads_how_far_sittings_moved():
    prior = shift_prior(_sittings({"a": 0.0, "b": 0.2, "c": -0.2}))
    tau, tau_ws, sigma = prior[0]
    assert 0.1 < tau < 0.3  # the sittings' medians: about 0, +0.25, -0.2
    assert 0.01 < tau_ws < 0.1  # sitting b moved its world size 2 plans 0.1 more
    assert 0.02 < sigma < 0.1  # the plans' own scatter, 0.05
    assert np.isnan(prior[1]).all()  # no GPU sittings


def test_shift_prior_needs_three_sittings():
    assert np.isnan(shift_prior(_sittings({"a": 0.0, "b": 0.2}))).all()


def test_probe_names_are_checked_and_must_exist(tmp_path):
    with pytest.raises(ValueError, match="probe: .* is not a probe name"):
        probe_path("../etc/passwd", tmp_path)
    with pytest.raises(ValueError, match="probe: no runs named 'missing'"):
        load_probe("missing", tmp_path)
    with pytest.raises(ValueError, match="more than a probe's 32"):
        load_probe("cpu-v4")  # a whole sweep named as a probe


def test_probe_spec_takes_a_prefix_of_the_cpu_plans():
    three, ten = probe_spec(3, "p3"), probe_spec(10, "p10")
    assert [p.run_id for p in ten.points[:3]] == [p.run_id for p in three.points]
    assert sorted(p.cluster.world_size for p in three.points) == [1, 2, 4]
    assert {p.workload.family for p in three.points} == {"gpt", "llama", "moe"}
    assert three.repeat_fraction == 0 and three.name == "p3"
    for k in (0, 11):
        with pytest.raises(InputError, match="--k"):
            probe_spec(k, "p")


@pytest.mark.parametrize("world_size, per_node", [(1, 1), (8, 8), (16, 8)])
def test_cuda_probe_plans_are_valid_at_the_jobs_size(world_size, per_node):
    points = cuda_points(world_size, per_node, 80 * 2**30, "h100")
    assert len(points) == 3 and len({p.run_id for p in points}) == 3
    for p in points:
        assert p.cluster.world_size == world_size
        assert not plan_problems(p.workload, p.plan, p.cluster)
