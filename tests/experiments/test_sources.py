"""Leave one source out: sources told apart, each held out whole, intervals calibrated on the other sources only,
and a probe that moves a source by its own runs."""

import math

import numpy as np
import pandas as pd
import pytest

from experiments.sources.report import PROBES, source_records
from experiments.sources.scale_trend import check, verdict
from gnn.dataset.splits import source_of, source_splits
from gnn.inference import new_source
from gnn.inference.predictor import BatchPredictor
from gnn.inference.probe import Z_UPPER, MachineCorrection
from tests.serve.conftest import REPO
from tests.serve.test_predictor import _specs

SWEEPS = [  # sweep_id, source text, domain, runs
    ("playbook-h100", "Ultra-Scale Playbook", "h100", 30),
    ("vtrain-a100-single", "vTrain", "a100", 25),
    ("published-h100", "NVIDIA/NeMo docs/source/performance", "h100", 21),
    ("published-h100", "NVIDIA-NeMo/Megatron-Bridge docs", "h100", 10),
    ("published-blackwell", "NVIDIA-NeMo/Megatron-Bridge docs", "gb200", 12),
    ("published-moe", "NVIDIA-NeMo/Megatron-Bridge docs", "b200", 5),
    ("gpu-h200-v1", "", "h200", 20),
    ("probe-h200-20261126", "", "h200", 3),
    ("cpu-sitting-20261126-a", "", "cpu", 4),
    ("cpu-v1", "", "cpu", 4),
]


@pytest.fixture
def meta() -> pd.DataFrame:
    rows = [
        {"sweep_id": sweep, "source": text, "domain": domain, "run_id": f"{sweep}-{domain}-{i}", "status": "ok",
         "iter_time_s": 1.0, "peak_mem_method": None}
        for sweep, text, domain, n in SWEEPS for i in range(n)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_each_row_has_its_source(meta):
    counts = source_of(meta).value_counts().to_dict()
    assert counts == {
        "playbook": 30, "vtrain": 25, "nemo-24.07": 21, "nvidia-dense": 22, "nvidia-moe": 5, "collector-h200": 23,
        "cpu": 4, "cpu-sitting-20261126-a": 4,
    }  # fmt: skip


def test_each_gpu_source_with_enough_timed_runs_is_held_out_whole(meta):
    moe = meta[meta["sweep_id"] == "published-moe"]
    failed = moe.assign(status="failed", iter_time_s=np.nan)
    meta = pd.concat([meta] + [failed.assign(run_id=failed["run_id"] + f"-failed{i}") for i in range(4)])
    meta = meta.reset_index(drop=True)  # the MoE table: 25 runs, 5 timed: too few to be held out
    splits = source_splits(meta)
    assert sorted(splits) == [
        f"source/held_out-{s}" for s in ("collector-h200", "nemo-24.07", "nvidia-dense", "playbook", "vtrain")
    ]
    source = source_of(meta)
    for name, parts in splits.items():
        held = name.removeprefix("source/held_out-")
        assert set(source[parts["test"]]) == {held} and (source == held).sum() == len(parts["test"])
        assert held not in set(source[np.concatenate([parts["train"], parts["val"]])])


def _residual_rows(shifts: dict[str, float], n: int = 40, spread: float = 0.1) -> pd.DataFrame:
    """Held-out runs of sources each moved by its shift, plans about it by +-spread, measured 1 s each, on world
    sizes in no order of the deviation (the cheapest runs are the probe)."""
    frames = []
    for source, shift in shifts.items():
        deviation = np.linspace(-spread, spread, n)
        predicted = np.exp(-(shift + deviation))
        frames.append(pd.DataFrame({
            "source": source, "status": "ok", "iter_time_s": 1.0, "peak_mem_bytes": np.nan,
            "pred_time_s": predicted, "pred_time_lo_s": predicted / 1.05, "pred_time_hi_s": predicted * 1.05,
            "world_size": np.random.default_rng(0).permutation(n) + 1, "rule_time_s": 0.5, "family": "llama",
            "num_params": 1e9, "memory_bytes": 8e10, "pred_mem_bytes": 1e10,
        }))  # fmt: skip
    return pd.concat(frames, ignore_index=True)


def test_calibration_learns_how_whole_sources_moved_each_source_weighing_the_same():
    rows = _residual_rows({"a": 0.0, "b": 0.2, "c": 0.4})
    rows = pd.concat([rows, _residual_rows({"a": 0.0}, n=400)], ignore_index=True)  # a is 10x larger: same weight
    c = new_source.fit(rows)["time"]
    assert c["tau"] == pytest.approx(math.sqrt((0.2**2 + 0.4**2) / 3), abs=1e-3)  # about no shift: both ways
    assert 0.07 < c["within"] < 0.1  # 80% of |deviation| <= 0.08..0.1 of the +-0.1 spread
    assert c["sources"] == ["a", "b", "c"] and "memory" not in new_source.fit(rows)


def test_a_gpu_interval_is_at_least_the_new_source_width_about_its_point():
    c = {"time": {"tau": 0.2, "within": 0.3}}
    columns = {"iter_time_s": np.array([1.0, 1.0]), "iter_time_lo_s": np.array([0.9, 0.1]),
               "iter_time_hi_s": np.array([1.1, 3.0])}  # fmt: skip
    out = new_source.widen(columns, c)
    half = math.hypot(0.3, Z_UPPER * 0.2)
    assert out["iter_time_s"] == pytest.approx([1.0, 1.0])
    assert np.log(out["iter_time_s"] / out["iter_time_lo_s"]) == pytest.approx([half, np.log(10)])
    assert np.log(out["iter_time_hi_s"] / out["iter_time_s"]) == pytest.approx([half, np.log(3)])


def test_a_source_is_calibrated_on_the_others_and_moved_by_its_own_probe():
    others = _residual_rows({"a": 0.0, "b": 0.5, "c": -0.5})
    held = _residual_rows({"x": 1.0})  # a source the others never moved like: predicted e times too fast
    records = {r["k"]: r for r in source_records("x", held, others) if r["target"] == "time"}
    assert sorted(records) == list(PROBES)
    assert records[0]["bias"] == pytest.approx(math.exp(-1.0), rel=0.05)  # its own shift unknown to it
    assert records[0]["coverage"] == 0.0
    assert records[3]["bias"] > 0.9 and records[10]["coverage"] > 0.7  # a few runs tell the source's shift
    assert records[0]["rule_mdape"] == pytest.approx(0.5)


def test_a_probe_replaces_the_source_doubt_the_interval_held():
    tau, within = 0.3, 0.1
    half = math.hypot(within, Z_UPPER * tau)
    columns = {"iter_time_s": np.array([1.0]), "iter_time_lo_s": np.exp([-half]), "iter_time_hi_s": np.exp([half])}
    correction = MachineCorrection((0.2,) * 10, (8,) * 10, (tau, 0.0, within / Z_UPPER), "p", tau)
    mean, sd = correction.shift([8])
    out = correction.apply(columns, 8)
    assert np.log(out["iter_time_hi_s"] / out["iter_time_s"]) == pytest.approx(math.hypot(within, Z_UPPER * sd[0]))
    assert out["iter_time_s"] == pytest.approx(np.exp(mean))


def test_gpu_plans_of_a_model_with_the_calibration_take_it_and_cpu_plans_do_not(predictor_path):
    predictor, spec = BatchPredictor.load(predictor_path, REPO / "data" / "hardware"), _specs(1)
    plain = predictor.predict_columns(spec, "a100-80gb", workers=0)
    info = predictor.info | {"new_source": {"time": {"tau": 0.4, "within": 0.2, "sources": ["a", "b", "c"]}}}
    calibrated = BatchPredictor(predictor.ensemble, predictor.hardware_dir, info)
    out = calibrated.predict_columns(spec, "a100-80gb", workers=0)
    assert out["iter_time_s"] == pytest.approx(plain["iter_time_s"])
    assert np.log(out["iter_time_hi_s"] / out["iter_time_s"])[0] >= math.hypot(0.2, Z_UPPER * 0.4) - 1e-9
    assert out["peak_mem_bytes"] == pytest.approx(plain["peak_mem_bytes"])  # no memory calibration: unchanged
    assert calibrated.calibration({"device": "cuda"}) == new_source.NAME
    assert calibrated.calibration({"device": "cpu"}) == "in-distribution"
    assert calibrated.calibration({"device": "cuda"}, calibrated_as="fake") == "in-distribution"
    assert predictor.calibration({"device": "cuda"}) == "in-distribution"


def test_a_probe_is_surer_near_its_own_scale_and_never_less_sure_than_no_probe():
    tau, within = 0.3, 0.1
    correction = MachineCorrection((0.2, 0.25, 0.15), (8, 8, 16), (tau, 0.0, within / Z_UPPER), slope_sd=0.1)
    mean, sd = correction.shift([8, 64, 8192])
    assert mean[0] == pytest.approx(mean[1]) == pytest.approx(mean[2])  # the point takes no trend from three runs
    assert sd[0] < sd[1] < sd[2] == pytest.approx(tau)  # doubt grows with the doublings away, up to no probe's
    flat = MachineCorrection((0.2, 0.25, 0.15), (8, 8, 16), (tau, 0.0, within / Z_UPPER))
    assert flat.shift([8192])[1][0] < sd[2]


def test_the_slope_prior_is_how_far_sources_drifted_per_doubling():
    rows = _residual_rows({"a": 0.0, "b": 0.0})
    for source, slope in (("a", 0.1), ("b", -0.2)):  # each source's error grows (shrinks) with its GPUs
        one = rows["source"] == source
        rows.loc[one, "pred_time_s"] = np.exp(-slope * np.log2(rows.loc[one, "world_size"]))
    rows = pd.concat([rows, _residual_rows({"c": 0.1})], ignore_index=True)
    assert new_source.fit(rows)["time"]["slope_sd"] == pytest.approx(math.sqrt((0.1**2 + 0.2**2 + 0.0) / 3), rel=0.05)


def _runs(levels: dict[int, float], noise: float = 0.05, n: int = 12) -> pd.DataFrame:
    """A source's residuals: n runs at each level (log2 GPUs) about its median, spread by +-noise."""
    spread = np.linspace(-noise, noise, n)
    return pd.DataFrame([{"level": lv, "r": r + s} for lv, r in levels.items() for s in spread])


def test_a_trend_carries_where_the_slowdown_keeps_growing_and_not_where_it_levelled_off():
    growing = [check(_runs({2: 0.0, 3: 0.1, 4: 0.2, 5: 0.3}), level) for level in (4, 5)]
    assert all(c["error_trend"] < 0.05 < c["error_constant"] for c in growing) and verdict(growing) == "trend"
    assert growing[1]["slope"] == pytest.approx(0.1) and growing[1]["edge"] == pytest.approx(0.2)
    levelled = [check(_runs({2: 0.0, 3: 0.1, 4: 0.2, 5: 0.2, 6: 0.2}), level) for level in (5, 6)]
    assert levelled[0]["error_constant"] < levelled[0]["error_trend"] and verdict(levelled) == "constant"
    assert check(_runs({3: 0.0, 4: 0.1}), 4) is None  # one level below: no slope
    assert check(_runs({2: 0.0, 3: 0.1, 4: 0.2}).iloc[:-10], 4) is None  # two runs at the held-out size
