"""Fake traces as training rows: the traced peak as allocated, labelled oom beyond what the device can allocate, no
time, and never mixed into a measured split's test; on a batch of them the time head is only pulled toward its
physics base, never toward a NaN."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from collect.fake.device import allocatable, on_device
from gnn.dataset.rows import fake_as_gpu_rows, has_time, load_fake
from gnn.dataset.splits import FAKE_PARTS, SERVING_SPLIT, calibration_domain, is_fake, named_splits

REPO = Path(__file__).resolve().parents[3]
FAKE = REPO / "data" / "fake"
A_SWEEP = "fake-issue53-v4"  # a small committed fake sweep: six Llama 3.1 70B plans


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """The graph dataset over vTrain's A100 rows and one committed fake sweep."""
    from gnn.dataset.graphs import PlanGraphs

    root = tmp_path_factory.mktemp("data")
    (root / "hardware").symlink_to(REPO / "data" / "hardware")
    (root / "fake").mkdir()
    for suffix in (".parquet", ".sweep.json"):
        shutil.copy(FAKE / f"{A_SWEEP}{suffix}", root / "fake" / f"{A_SWEEP}{suffix}")
    return PlanGraphs(root=root, runs=[REPO / "data" / "runs" / "vtrain-a100.parquet"])


def test_a_fake_row_learns_its_allocated_peak_and_does_not_fit_where_the_device_would_hold_more():
    traced = load_fake(FAKE)
    rows = fake_as_gpu_rows(traced)
    assert len(rows) == traced["run_id"].nunique() and (rows["peak_mem_method"] == "fake").all()
    # learned as allocated, the quantity of every measured GPU row; what the device adds only decides oom
    assert (rows["peak_mem_bytes"].to_numpy() == traced["peak_mem_bytes"].to_numpy()).all()
    assert not has_time(rows).any() and (rows["fingerprint_id"] == "h100-80gb").all()
    on_gpu = rows["peak_mem_bytes"].map(lambda b: on_device(b, "cuda"))
    assert ((rows["status"] == "oom") == (on_gpu > rows["memory_bytes"])).all()
    between = (rows["peak_mem_bytes"] <= rows["memory_bytes"]) & (on_gpu > rows["memory_bytes"])
    assert between.any(), "some trace allocates less than the device's memory and still does not fit on it"


def test_allocatable_is_the_inverse_of_what_a_gpu_adds():
    capacity = 80 * 2**30
    assert on_device(allocatable(capacity, "cuda"), "cuda") == pytest.approx(capacity)
    assert allocatable(capacity, "cuda") < capacity - 2**30 and allocatable(capacity, "cpu") == capacity


def test_the_dataset_holds_the_traces_with_memory_and_no_time(dataset):
    fake = is_fake(dataset.meta).to_numpy()
    assert fake.sum() == 6 and (dataset.meta.loc[fake, "domain"] == "h100").all()
    y = torch.cat([dataset[int(i)].y for i in np.flatnonzero(fake)])
    assert torch.isnan(y[:, 0]).all() and torch.isfinite(y[:, 1]).all()
    first = dataset.meta[fake].iloc[0]
    assert math.isclose(math.exp(float(y[0, 1])), first["peak_mem_bytes"], rel_tol=1e-6)


def test_traces_are_learned_in_the_serving_split_and_tested_only_where_held_out(dataset):
    splits = named_splits(dataset.meta)
    fake = set(np.flatnonzero(is_fake(dataset.meta).to_numpy()))
    serving = splits[SERVING_SPLIT]
    assert fake <= set(serving["train"]) | set(serving["val"]) | set(serving["test"])
    for name, parts in splits.items():
        if name.startswith("a100/"):  # a measured split of another GPU: the traces are none of its rows
            assert not fake & set(np.concatenate(list(parts.values())))
    llama = set(np.flatnonzero((is_fake(dataset.meta) & (dataset.meta["family"] == "llama")).to_numpy()))
    held = splits["fake/held_out_model-llama-70b"]  # each family's largest traced model
    assert set(held["test"]) == llama and not llama & (set(held["train"]) | set(held["val"]))
    assert fake - llama <= set(held["train"]) | set(held["val"])


def test_on_traces_the_time_head_is_pulled_toward_its_base_and_on_measured_runs_not(dataset):
    from torch_geometric.loader import DataLoader

    from gnn.predictors.surrogate import TrainConfig, build_module

    fake = np.flatnonzero(is_fake(dataset.meta).to_numpy())
    module = build_module(dataset, TrainConfig(hidden=16, num_layers=2), np.arange(len(dataset)))
    module.log = lambda *a, **k: None  # outside a Trainer
    batch = next(iter(DataLoader(dataset[torch.as_tensor(fake)], batch_size=len(fake))))
    out, has_time = module(batch), ~torch.isnan(batch.y[:, 0])
    correction = out[:, 0] - module.model.physics_offset(batch.u)[:, 0]
    # a batch of traces alone: their summed correction (no measured graph to weigh it against)
    assert torch.isclose(module._unmeasured_time_prior(out, batch, has_time), correction.abs().sum())
    loss = module._common_step(batch, 0, "train")
    assert torch.isfinite(loss) and loss > 0
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters() if p.grad is not None)
    measured = next(iter(DataLoader(dataset[torch.arange(8)], batch_size=8)))  # vTrain's runs: time measured
    assert module._unmeasured_time_prior(module(measured), measured, torch.ones(8, dtype=torch.bool)) == 0


def test_a_traces_interval_is_calibrated_on_traces_and_a_measured_runs_on_measured_runs(dataset):
    """A trace's peak has none of a measurement's noise: its interval takes the factor fitted on the traces, and a
    measured run of the same plan on the same GPU its GPU's, never one pooled from both."""
    from gnn.inference.predictor import BatchPredictor

    meta, ens = dataset.meta, _untrained(dataset)
    ens.domain_names, ens.k_domain = ["fake", "h100"], torch.tensor([[1.0, 1.0], [1.0, 4.0]])
    traces = meta[is_fake(meta)]
    measured = traces.assign(peak_mem_method="allocator")  # the same plans, as if run on the GPU
    predictor = BatchPredictor(ens, dataset.hardware_dir)
    width = {}
    for name, rows in (("fake", traces), ("h100", measured)):
        pred = predictor.predict_rows(rows)
        width[name] = np.log(pred["peak_mem_hi_bytes"] / pred["peak_mem_lo_bytes"]).to_numpy()
    # 4x wider, but where an untrained member's point sits by the physics floor, which clips the lower bound
    ratio = width["h100"] / width["fake"]
    assert (width["fake"] > 0).all() and (ratio > 3).all() and np.isclose(np.median(ratio), 4, rtol=1e-3)


def test_pipelined_traces_are_calibrated_apart_and_too_few_take_every_traces_factor(dataset):
    """Traces predicted worse (the pipelined ones) get wider intervals of their own and the rest narrower ones, where
    each part has enough validation rows; a part with too few takes the factor fitted on every trace."""
    from gnn.model.ensemble import MIN_CALIBRATION_ROWS

    meta = dataset.meta
    traces, measured = meta[is_fake(meta)], meta[~is_fake(meta)]
    assert (calibration_domain(traces) == FAKE_PARTS[False]).all()  # the committed sweep: none pipelined
    assert (calibration_domain(traces.assign(pp=4)) == FAKE_PARTS[True]).all()
    assert (calibration_domain(measured) == measured["domain"]).all()
    ens, n = _untrained(dataset), 3 * MIN_CALIBRATION_ROWS
    graphs, log_time = dataset[torch.arange(n)], np.log(meta["iter_time_s"].to_numpy(dtype=float)[:n])
    point = np.log(ens.predict(graphs)["peak_mem_bytes"])  # calibrating moves it (its limits), by < 1 log unit here
    for pipelined, domains in ((n // 2, ["fake", *FAKE_PARTS.values()]), (5, ["fake", FAKE_PARTS[False]])):
        parts = np.array([FAKE_PARTS[True]] * pipelined + [FAKE_PARTS[False]] * (n - pipelined))
        error = np.where(parts == FAKE_PARTS[True], 5.0, 0.0) * np.linspace(0.5, 1.0, n)
        ens.calibrate(graphs, log_time, point + error, parts.tolist())
        assert sorted(ens.domain_names) == sorted(domains)
        k = ens.interval_factors(np.ones(3, dtype=int), ["fake", *FAKE_PARTS.values()])[:, 1]
        if pipelined >= MIN_CALIBRATION_ROWS:
            assert k[1] > 3 * k[2] and k[2] < k[0] < k[1]
        else:
            assert k[1] == k[0] and k[2] <= k[0]


def _untrained(dataset):
    """An ensemble of one untrained member over ``dataset``'s features, its device class column set."""
    from gnn.model.ensemble import Ensemble
    from gnn.predictors.surrogate import TrainConfig, build_module

    names = [c for c in dataset.meta.columns if c.startswith("f_")]
    ens = Ensemble([build_module(dataset, TrainConfig(hidden=16, num_layers=2), np.arange(len(dataset)))])
    ens.class_column = names.index("f_cuda")
    return ens
