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


def test_more_runs_move_further_and_doubt_less():
    r = np.log([1.2, 1.2, 1.2, 1.2, 1.2, 1.2, 1.2, 1.2, 1.2, 1.2])
    one, three, ten = (MachineCorrection.fit(r[:n], tau=0.1, sigma=0.1) for n in (1, 3, 10))
    assert 0 < one.shift < three.shift < ten.shift < math.log(1.2)
    assert one.sd > three.sd > ten.sd
    assert ten.shift == pytest.approx(math.log(1.2) * 10 / 11)  # lam = (sigma / tau)^2 = 1
    assert ten.sd == pytest.approx(0.1 / math.sqrt(11))


def test_without_a_prior_the_runs_mean_is_taken():
    c = MachineCorrection.fit(np.log([1.1, 1.3]), tau=float("nan"), sigma=0.2)
    assert c.factor == pytest.approx(math.exp(np.log([1.1, 1.3]).mean()))
    assert MachineCorrection.fit(np.array([]), tau=float("nan"), sigma=0.2).runs == 0


def test_apply_moves_the_point_and_widens_both_sides():
    c = MachineCorrection(shift=math.log(1.5), sd=0.2, runs=3)
    out = c.apply(COLUMNS)
    assert out["iter_time_s"] == pytest.approx(COLUMNS["iter_time_s"] * 1.5)
    below = np.log(out["iter_time_s"] / out["iter_time_lo_s"])
    above = np.log(out["iter_time_hi_s"] / out["iter_time_s"])
    assert np.all(below > np.log(COLUMNS["iter_time_s"] / COLUMNS["iter_time_lo_s"]))
    assert np.all(above > np.log(COLUMNS["iter_time_hi_s"] / COLUMNS["iter_time_s"]))
    assert COLUMNS["iter_time_s"][0] == 1.0  # the caller's columns are left as they were


def _sittings(shifts: dict[str, float], plans: int = 12, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for fingerprint, shift in shifts.items():
        for p in range(plans):
            t = (1 + p) * math.exp(shift + rng.normal(0, 0.05))
            rows.append({"run_id": f"plan{p}", "fingerprint_id": fingerprint, "iter_time_s": t, "status": "ok",
                         "device": "cpu"})  # fmt: skip
    return pd.DataFrame(rows)


def test_shift_prior_reads_how_far_sittings_moved():
    prior = shift_prior(_sittings({"a": 0.0, "b": 0.2, "c": -0.2}))
    tau, sigma = prior[0]
    assert 0.1 < tau < 0.3  # the sittings' medians: 0, +0.2, -0.2 about their mean
    assert 0.02 < sigma < 0.1  # the plans' own scatter, 0.05
    assert np.isnan(prior[1]).all()  # no GPU sittings


def test_shift_prior_needs_three_sittings():
    assert np.isnan(shift_prior(_sittings({"a": 0.0, "b": 0.2}))).all()


def test_probe_names_are_checked_and_must_exist(tmp_path):
    with pytest.raises(ValueError, match="probe: .* is not a probe name"):
        probe_path("../etc/passwd", tmp_path)
    with pytest.raises(ValueError, match="probe: no runs named 'missing'"):
        load_probe("missing", tmp_path)


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
