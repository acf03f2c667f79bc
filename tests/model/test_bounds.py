"""The limits of the 80% intervals (gnn.model.intervals.bounds): a physics floor, a ceiling, widening out of range."""

import copy
import math

import numpy as np
import pandas as pd
import torch

from gnn.model.intervals.bounds import Limits


def _names(ds) -> list[str]:
    return [c for c in ds.meta.columns if c.startswith("f_")]


def _columns(limits: Limits, rows: pd.DataFrame, names: list[str]) -> np.ndarray:
    return limits.columns(torch.tensor(rows[names].to_numpy(dtype=np.float32)))


def test_the_floor_is_compute_at_peak_and_no_measured_run_beats_it(vtrain_dataset):
    names = _names(vtrain_dataset)
    limits, meta = Limits(names), vtrain_dataset.meta
    floor = limits.floor_s(_columns(limits, meta, names))
    row = meta.iloc[0]
    # by hand: 6 FLOPs per non-embedding parameter per token of the global batch, over the GPUs at peak
    params = math.exp(row["f_log_active_params"]) - math.exp(row["f_log_vocab"] + row["f_log_hidden"])
    tokens = row["global_batch_size"] * row["seq_len"]
    by_hand = 6 * params * tokens / (row["world_size"] * math.exp(row["f_log_flops_per_s"]))
    assert floor[0] == np.float64(floor[0]) and abs(floor[0] / by_hand - 1) < 1e-3
    assert (meta["iter_time_s"].to_numpy() > floor).all()


def test_distance_counts_doublings_outside_the_training_range(vtrain_dataset):
    names, meta = _names(vtrain_dataset), vtrain_dataset.meta
    limits = Limits(names)
    small = meta[meta["world_size"] < meta["world_size"].max()]
    limits.fit_ranges(_columns(limits, small, names), ["a100"] * len(small))
    assert limits.domain_names == ["a100"]
    inside = limits.distance(_columns(limits, small, names), ["a100"] * len(small))
    assert inside.shape == (len(small), 2)  # time, memory
    assert (inside == 0).all()
    biggest = meta[meta["world_size"] == meta["world_size"].max()]
    outside = limits.distance(_columns(limits, biggest, names), ["a100"] * len(biggest))
    doublings = math.log2(biggest["world_size"].iloc[0] / small["world_size"].max())
    assert (outside >= doublings - 1e-6).all()  # at least the world size's doublings (dp grows with it)
    # a GPU never trained on is measured against the union of the domains' ranges
    assert (limits.distance(_columns(limits, small, names), ["v100"] * len(small)) == 0).all()


def test_rows_measuring_memory_only_extend_memory_s_range_not_time_s(vtrain_dataset):
    """A fake trace of a plan larger than any measured run teaches memory there, never time."""
    names, meta = _names(vtrain_dataset), vtrain_dataset.meta
    limits = Limits(names)
    largest = (meta["world_size"] == meta["world_size"].max()).to_numpy()
    measured = np.column_stack([~largest, np.ones(len(meta), dtype=bool)])  # the largest: memory only
    limits.fit_ranges(_columns(limits, meta, names), ["a100"] * len(meta), measured)
    far = limits.distance(_columns(limits, meta[largest], names), ["a100"] * int(largest.sum()))
    assert (far[:, 0] > 0).all() and (far[:, 1] == 0).all()
    beyond = limits.beyond_largest(_columns(limits, meta[largest], names), ["a100"] * int(largest.sum()))
    assert beyond[:, 0, 0].all() and not beyond[:, 0, 1].any()  # beyond time's largest scale, inside memory's


def test_no_member_says_less_memory_than_the_weights_and_moments_spread_over_every_gpu(
    vtrain_dataset, small_parts, ensemble
):
    """A member never trained on a model's memory once said 16 KB for DeepSeek-V3: the floor rules that out."""
    idx = small_parts["test"][:8]
    raw, classes, base, cols = ensemble.raw(vtrain_dataset[torch.as_tensor(idx)])
    rows = vtrain_dataset.meta.loc[idx]
    by_hand = np.exp(rows["f_log_params"]) * (2 + 4) / rows["world_size"]  # bf16 weights, two bf16 moments at least
    assert np.allclose(ensemble.limits.floor_mem_bytes(cols), by_hand, rtol=1e-3)
    raw = raw.copy()
    raw[:, :, 1] = np.log(16e3)  # every member: 16 KB
    out = ensemble._outputs(raw, classes, base, cols, ["a100"] * len(idx))
    assert (out["peak_mem_lo_bytes"] >= by_hand.to_numpy() * (1 - 1e-3)).all()


def test_members_that_disagree_wildly_still_give_a_finite_interval_inside_the_limits(
    vtrain_dataset, small_parts, ensemble
):
    """The Llama 3.1 70B search once printed 0.0 s - inf: members 30 log units apart must not do that."""
    ens = copy.deepcopy(ensemble)
    idx = small_parts["test"][:12]
    raw, classes, base, cols = ens.raw(vtrain_dataset[torch.as_tensor(idx)])
    raw = raw.copy()
    raw[0, :, :2] += 30.0  # one member e^30 times too slow, another e^30 too fast
    raw[1, :, :2] -= 30.0
    out = ens._outputs(raw, classes, base, cols, ["a100"] * len(idx))
    floor, ceiling = ens.limits.limits(cols, classes, base[:, 0])
    for name, lo, hi, j in (("iter_time_s", "iter_time_lo_s", "iter_time_hi_s", 0),):
        assert np.isfinite(out[hi]).all() and (out[lo] > 0).all()
        assert (out[lo] <= out[name]).all() and (out[name] <= out[hi]).all()
        assert (np.log(out[lo]) >= floor[:, j] - 1e-6).all() and (np.log(out[hi]) <= ceiling[:, j] + 1e-6).all()
    assert np.isfinite(out["peak_mem_hi_bytes"]).all() and (out["peak_mem_lo_bytes"] > 0).all()


def test_calibration_sets_a_finite_ceiling_and_a_widening_that_grows_intervals_out_of_range(
    vtrain_dataset, small_parts, ensemble
):
    ens = copy.deepcopy(ensemble)
    assert np.isfinite(ens.limits.ceiling.numpy()[1, 0])  # CUDA time: calibrated on the A100 validation rows
    assert (ens.limits.widen.numpy() >= 0).all()
    idx = small_parts["test"][:8]
    graphs, domains = vtrain_dataset[torch.as_tensor(idx)], ["a100"] * len(idx)
    near = ens.predict(graphs, domains=domains)
    ens.limits.widen.fill_(0.5)
    ens.limits.ranges[..., 1] -= 1.0  # every plan now lies a doubling per quantity beyond the largest trained
    far = ens.predict(graphs, domains=domains)
    near_width = np.log(near["iter_time_hi_s"] / near["iter_time_lo_s"])
    far_width = np.log(far["iter_time_hi_s"] / far["iter_time_lo_s"])
    assert (far_width >= near_width - 1e-9).all() and (far_width > near_width).any()


def test_nested_checks_measure_error_growth_beyond_the_largest_scale(vtrain_dataset):
    from gnn.predictors.nested import widening

    names, meta = _names(vtrain_dataset), vtrain_dataset.meta
    out = widening(meta, Limits(names), names)
    assert out.shape == (2, 2) and np.isfinite(out).all() and (out >= 0).all()
    assert out[0].sum() == 0  # no CPU rows: nothing measured, nothing widened


def test_nested_checks_score_only_the_rows_asked_for(vtrain_dataset):
    from gnn.predictors.nested import widening

    names, meta = _names(vtrain_dataset), vtrain_dataset.meta
    everyone = widening(meta, Limits(names), names)
    assert (widening(meta, Limits(names), names, pd.Series(True, index=meta.index)) == everyone).all()
    assert (widening(meta, Limits(names), names, pd.Series(False, index=meta.index)) == 0).all()  # nothing scored


def test_beyond_a_range_where_the_correction_did_not_carry_the_point_is_the_physics(
    vtrain_dataset, small_parts, ensemble
):
    ens = copy.deepcopy(ensemble)
    keeps = ens.keeps_correction.numpy()
    assert keeps.shape == (2, 2) and keeps[:, 1].all()  # vTrain measured no memory: nothing to decide it on
    idx = small_parts["test"][:8]
    graphs, domains = vtrain_dataset[torch.as_tensor(idx)], ["a100"] * len(idx)
    inside = ens.predict(graphs, domains=domains)
    ens.keeps_correction[0, 0] = False  # time's correction does not carry beyond the largest scale
    assert np.allclose(ens.predict(graphs, domains=domains)["iter_time_s"], inside["iter_time_s"])  # none beyond
    ens.limits.ranges[:, :, 5, 1] = -1.0  # now every plan lies beyond the largest world size (half a GPU)
    _, classes, base, _ = ens.raw(graphs)
    beyond = ens.predict(graphs, domains=domains)
    assert np.allclose(np.log(beyond["iter_time_s"]), base[:, 0], atol=1e-5)  # the fitted analytical model
    assert (np.log(beyond["iter_time_hi_s"] / beyond["iter_time_lo_s"]) >= 0).all()


def test_a_member_outside_the_limits_says_the_physics_base_instead_of_the_limit():
    """Members e^35 s on a graph far larger than any trained on are out of their depth: the base stands in."""
    from gnn.model.intervals.conformal import bounded

    floor, ceiling = np.array([[0.0, -np.inf]]), np.array([[3.0, 30.0]])
    base = np.array([[1.0, 20.0]])
    raw = np.array([[[35.0, 21.0, 0.0]], [[np.inf, np.nan, 0.0]], [[2.0, 19.0, 0.0]], [[-4.0, 25.0, 0.0]]])
    out = bounded(raw, floor, ceiling, base)
    assert out[:, 0, 0].tolist() == [1.0, 1.0, 2.0, 1.0]  # above the ceiling, not a number, inside, below the floor
    assert out[:, 0, 1].tolist() == [21.0, 20.0, 19.0, 25.0]
    assert bounded(raw, floor, ceiling)[0, 0, 0] == 3.0  # without a base: clipped, as before
