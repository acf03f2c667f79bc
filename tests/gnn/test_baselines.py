"""The baselines and the evaluation records on a small real slice of the shipped data."""

import json

import numpy as np
import pandas as pd
import pytest

from experiments.evaluate import evaluate_predictor
from gnn.dataset.splits import named_splits
from gnn.predictors.metrics import error_stats, oom_stats, ranking_stats
from gnn.predictors.registry import BASELINE_NAMES, REGISTRY
from gnn.predictors.surrogate import TrainConfig


def test_dataset_graphs_and_targets(vtrain_dataset):
    dataset = vtrain_dataset
    assert len(dataset) == 1440 == len(dataset.meta)
    g = dataset[0]
    assert g.x.shape[1] == dataset.num_node_features and g.edge_index.shape[0] == 2
    assert g.edge_attr.shape[0] == g.edge_index.shape[1]
    assert np.isclose(float(g.y[0, 0]), np.log(dataset.meta.iter_time_s[0]), atol=1e-5)
    assert np.isnan(float(g.y[0, 1]))  # vTrain does not report memory


def test_splits_are_deterministic_and_disjoint(vtrain_dataset):
    dataset = vtrain_dataset
    a, b = named_splits(dataset.meta), named_splits(dataset.meta)
    assert set(a) == {
        "a100/random",
        "a100/held_out_hidden",
        "a100/held_out_layers",
        "a100/held_out_scale",
        "all/random",
    }
    # the serving split holds out exactly the domains' random test rows
    assert np.array_equal(a["all/random"]["test"], a["a100/random"]["test"])
    for name, parts in a.items():
        assert all(np.array_equal(parts[k], b[name][k]) for k in parts)
        assert not set(parts["train"]) & set(parts["test"]) and not set(parts["val"]) & set(parts["test"])
    test = dataset.meta.loc[a["a100/held_out_hidden"]["test"]]
    assert (test.hidden == dataset.meta.hidden.max()).all()


def test_the_moe_family_is_held_out_whole_and_only_where_there_is_one():
    n = 60
    meta = pd.DataFrame(
        {
            "run_id": [f"run{i}" for i in range(n)],
            "domain": "cpu",
            "family": ["gpt", "llama", "moe"] * (n // 3),
            "num_params": range(n),
            "world_size": [1, 2, 4] * (n // 3),
            "pp_schedule": None,
            "sharding": "none",
        }
    )
    parts = named_splits(meta)["cpu/held_out_moe"]
    assert (meta.loc[parts["test"], "family"] == "moe").all() and len(parts["test"]) == n // 3
    assert set(meta.loc[np.concatenate([parts["train"], parts["val"]]), "family"]) == {"gpt", "llama"}
    assert "cpu/held_out_moe" not in named_splits(meta[meta.family != "moe"].reset_index(drop=True))


def test_each_sitting_is_held_out_in_turn_and_trained_on_the_others():
    n = 60
    sweeps = ["cpu-v3", "cpu-sitting-20261126-a", "cpu-sitting-20261126-b", "cpu-sitting-20261126-b2"]
    n = 80
    meta = pd.DataFrame(
        {
            "run_id": [f"run{i % 20}" for i in range(n)],  # the same 20 plans in every sweep
            "domain": "cpu",
            "family": "gpt",
            "num_params": 1,
            "world_size": 1,
            "pp_schedule": None,
            "sharding": "none",
            "sweep_id": [sweeps[i // 20] for i in range(n)],
        }
    )
    splits = named_splits(meta)
    for tag, held in (("20261126-a", {"a"}), ("20261126-b", {"b", "b2"})):  # b2: b's sitting, run again at once
        parts = splits[f"cpu/held_out_sitting-{tag}"]
        held = {f"cpu-sitting-20261126-{h}" for h in held}
        assert set(meta.loc[parts["test"], "sweep_id"]) == held and len(parts["test"]) == 20 * len(held)
        trained = meta.loc[np.concatenate([parts["train"], parts["val"]])]
        assert not held & set(trained["sweep_id"]) and len(trained) == n - 20 * len(held)
    sittings = sorted(s for s in splits if "sitting" in s)
    assert sittings == ["cpu/held_out_sitting-20261126-a", "cpu/held_out_sitting-20261126-b"]  # not cpu-v3


def test_a_plan_measured_again_with_the_current_protocol_replaces_its_old_rows():
    from collect.schema import RunSpec
    from gnn.dataset.rows import drop_superseded, plan_key

    base = {"family": "gpt", "layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 512,
            "micro_batch_size": 1, "global_batch_size": 2, "dtype": "float32", "dp": 2, "tp": 1, "pp": 1,
            "num_microbatches": 1, "nodes": 1, "devices_per_node": 2, "device": "cpu", "device_kind": "cpu",
            "backend": "gloo"}  # fmt: skip
    rows = pd.DataFrame(
        [
            {**base, "memory_bytes": 2**23, "peak_mem_method": "profiler-events+worker-frees", "sweep_id": "old"},
            {**base, "memory_bytes": 2**30, "peak_mem_method": "profiler-events+worker-frees", "sweep_id": "old"},
            {**base, "memory_bytes": 2**34, "peak_mem_method": "counting-allocator", "sweep_id": "new"},
            {
                **base,
                "dp": 1,
                "devices_per_node": 1,
                "global_batch_size": 1,
                "memory_bytes": 2**30,
                "peak_mem_method": "profiler-events+worker-frees",
                "sweep_id": "old",
            },  # fmt: skip
        ]
    )
    kept = drop_superseded(rows)
    assert kept["sweep_id"].tolist() == ["new", "old"] and kept.iloc[1]["dp"] == 1  # a plan not measured again stays
    specs = [RunSpec.model_validate({"workload": {**{k: base[k] for k in ("layers", "hidden", "heads", "seq_len",
             "vocab", "micro_batch_size", "global_batch_size", "dtype")}}, "plan": {"dp": 2}, "cluster": {
             "devices_per_node": 2, "memory_bytes": m}}) for m in (2**23, 2**34)]  # fmt: skip
    assert specs[0].run_id != specs[1].run_id and plan_key(specs[0]) == plan_key(specs[1])


def test_a_held_out_blackwell_gpu_is_learned_from_nvidias_runs_on_the_others_and_served_from_its_own_rows_too():
    n = 46
    meta = pd.DataFrame(
        {
            "run_id": [f"run{i}" for i in range(n)],
            "domain": ["h100"] * 30 + ["gb200"] * 6 + ["cpu"] * 4 + ["v100"] * 2 + ["a100"] * 2 + ["b200"] * 2,
            "family": "llama",
            "source": "s",
            "sweep_id": ["published-x"] * 20
            + ["playbook"] * 10
            + ["published-x"] * 6
            + [None] * 4
            + ["d"] * 4
            + ["published-x"] * 2,
            "num_params": range(n),
            "world_size": 8,
            "pp_schedule": None,
            "sharding": "none",
            "hidden": [1024 * (1 + i % 3) for i in range(n)],
            "layers": [8 * (1 + i % 4) for i in range(n)],
        }
    )
    splits = named_splits(meta)
    parts = splits["gb200/held_out_gpu"]
    assert list(parts["test"]) == list(range(30, 36))  # every GB200 row, and nothing else
    learned = meta.loc[np.concatenate([parts["train"], parts["val"]])]
    assert set(learned["domain"]) == {"h100", "b200"} and set(learned["sweep_id"]) == {"published-x"}
    v100 = splits["v100/held_out_gpu"]
    assert set(meta.loc[np.concatenate([v100["train"], v100["val"]]), "domain"]) == {"a100"}  # the nearest GPU
    assert "gb200/random" in splits and "v100/random" not in splits
    serving = np.concatenate(list(splits["all/random"].values()))
    assert (meta.loc[serving, "domain"] == "gb200").any()  # the served model learns from Blackwell's rows
    assert not (meta.loc[serving, "domain"] == "v100").any()


@pytest.mark.parametrize("name", BASELINE_NAMES)
def test_every_baseline_fits_and_predicts_positive_times_where_it_prices_time(vtrain_dataset, name):
    dataset = vtrain_dataset
    parts = named_splits(dataset.meta)["a100/random"]
    records = evaluate_predictor(name, dataset.meta, "a100/random", parts)
    time = next(r for r in records if r["target"] == "time")
    if name == "megatron_memory":  # a memory estimate: it says nothing of time
        assert time["n"] == 0
    else:
        assert time["n"] == len(parts["test"]) and 0 <= time["mape"] < 1.0
    json.dumps(records)  # records are plain JSON


def test_the_gnn_behind_the_same_interface(vtrain_dataset):
    ds = vtrain_dataset
    parts = named_splits(ds.meta)["a100/random"]
    cfg = TrainConfig(max_epochs=2, hidden=16, num_layers=2, members=1)
    gnn = REGISTRY["gnn"](ds, cfg).fit(ds.meta.loc[parts["train"]], ds.meta.loc[parts["val"]])
    test = ds.meta.loc[parts["test"]]
    out = gnn.predict(test)
    assert list(out.columns) == ["pred_time_s", "pred_mem_bytes"] and out.index.equals(test.index)
    assert (out.pred_time_s > 0).all()


def test_metrics_by_hand():
    s = error_stats(np.array([110.0, 90.0]), np.array([100.0, 100.0]))
    assert s["mape"] == pytest.approx(0.10) and s["max"] == pytest.approx(0.10)
    o = oom_stats(np.array([5.0, 20.0, 20.0]), np.array([10.0, 10.0, 10.0]), np.array([False, True, False]))
    assert o["accuracy"] == pytest.approx(2 / 3) and o["recall"] == 1.0 and o["precision"] == 0.5


def test_ranking_by_hand():
    import pandas as pd

    rows = pd.DataFrame(
        {
            "domain": "cpu",
            "layers": 2,
            "hidden": 64,
            "heads": 4,
            "seq_len": 32,
            "global_batch_size": 4,
            "world_size": 2,
            "run_id": ["a", "b", "c"],
            "iter_time_s": [1.0, 1.05, 2.0],
        }
    )
    # predicted order b < a < c: b is chosen, and it is within 10% of the measured fastest a
    r = ranking_stats(rows, pd.Series([1.1, 1.0, 3.0]))
    assert r["top1_success"] == 1.0 and r["kendall_tau"] == pytest.approx(1 / 3)


def test_the_networks_analytical_base_is_the_fitted_baseline(vtrain_dataset):
    import torch

    from gnn.model.physics_base import AnalyticalTimeBase
    from gnn.predictors.baselines import AnalyticalPredictor

    meta = vtrain_dataset.meta.copy()
    # every other row as Nanotron, every third with its collectives overlapped, so the latency terms are compared too
    meta["f_tp_layer_latency"] = (np.arange(len(meta)) % 2).astype(float)
    meta["f_tp_exposed"] = (np.arange(len(meta)) % 3 > 0).astype(float)
    names = [c for c in meta.columns if c.startswith("f_")]
    train, rows = meta.iloc[:500], meta.iloc[500:600]
    base = AnalyticalTimeBase(names)
    base.fit(train)
    u = torch.tensor(rows[names].to_numpy(dtype=float), dtype=torch.float32)
    expected = AnalyticalPredictor().fit(train).predict(rows)["pred_time_s"].to_numpy()
    np.testing.assert_allclose(np.exp(base(u).numpy()), expected, rtol=1e-4)
    assert base.coef[1, 5:].sum() > 0  # the fit used the latency terms


def test_a_latency_per_layer_by_hand():
    """8 layers on 2 stages, 4 micro-batches, tp 4: 16 layer passes per rank, each waiting tp - 1 = 3 ring steps if
    exposed, again if pipelined, and again under Nanotron's convention if pipelined; nothing if overlapped or tp 1."""
    from gnn.costs.efficiency import time_terms

    rows = pd.DataFrame(
        {
            "f_log2_pp": [1.0, 1.0, 0.0, 1.0, 1.0],
            "f_log2_tp": [2.0, 2.0, 2.0, 0.0, 2.0],
            "f_tp_exposed": [1.0, 1.0, 1.0, 1.0, 0.0],
            "f_tp_layer_latency": [1.0, 0.0, 1.0, 1.0, 0.0],
        }
    )
    rows = rows.assign(
        f_log_sim_compute=0, f_log_sim_comm=0, f_log2_num_microbatches=2, f_log2_virtual_stages=0, layers=8
    )
    latency = time_terms(rows)[:, 6:]
    np.testing.assert_allclose(latency, [[48, 48, 48], [48, 48, 0], [96, 0, 0], [0, 0, 0], [0, 0, 0]])


def test_compute_from_a_kernel_table_takes_an_efficiency_of_its_own():
    """A GPU's measured kernels and a datasheet err differently: their compute terms are fitted apart."""
    from gnn.costs.efficiency import time_terms

    rows = pd.DataFrame({"f_log_sim_compute": [0.0, np.log(2.0)], "f_kernel_table": [0.0, 1.0]})
    rows = rows.assign(f_log_sim_comm=0.0, f_log2_pp=0.0, f_log2_num_microbatches=0.0, f_log2_virtual_stages=0.0)
    rows = rows.assign(f_log2_tp=0.0, f_tp_exposed=1.0, f_tp_layer_latency=0.0, layers=1)
    np.testing.assert_allclose(time_terms(rows)[:, :2], [[1, 0], [0, 2]])


def test_the_rule_of_thumb_by_hand():
    """6 x parameters x tokens at 40% of the datasheet peak: 1B parameters, 256 x 4096 tokens on 8 H100s (bf16
    989.4 TFLOP/s) take 6e9 x 1,048,576 / (8 x 989.4e12 x 0.4) = 1.99 s; a CPU fingerprint has no datasheet."""
    rows = pd.DataFrame(
        {
            "fingerprint_id": ["h100-80gb", "vm-20261124T082103"],
            "dtype": ["bfloat16", "float32"],
            "f_log_active_params": [np.log(1e9)] * 2,
            "global_batch_size": [256, 256],
            "seq_len": [4096, 4096],
            "world_size": [8, 8],
        }
    )
    pred = REGISTRY["rule_of_thumb"]().fit(rows).predict(rows)
    assert pred["pred_time_s"].iloc[0] == pytest.approx(6e9 * 256 * 4096 / (8 * 989.4e12 * 0.4))
    assert np.isnan(pred["pred_time_s"].iloc[1]) and pred["pred_mem_bytes"].isna().all()


def test_megatron_style_memory_by_hand():
    """4 layers of 12M parameters and a 1,024,000-parameter embedding (untied: two of them), bf16 on one GPU: the
    first stage holds 49.024M parameters at 18 bytes; 128 tokens keep 128 x 1024 x (18 + 4 x 4096 / 1024) bytes per
    layer. A distributed optimizer over dp 4 keeps 6 + 12 / 4 bytes per parameter."""
    row = {
        "hidden": 1024, "layers": 4, "vocab": 1000, "tied_embeddings": False, "num_params": 4 * 12_000_000 + 2_048_000,
        "tp": 1, "pp": 1, "dp": 1, "cp": np.nan, "sharding": "none", "dtype": "bfloat16", "seq_len": 128,
        "micro_batch_size": 1, "ffn_hidden": 4096,
    }  # fmt: skip
    rows = pd.DataFrame([row, {**row, "dp": 4, "sharding": "zero1"}])
    pred = REGISTRY["megatron_memory"]().fit(rows).predict(rows)["pred_mem_bytes"]
    activations = 128 * 1024 * (18 + 16) * 4
    assert pred.iloc[0] == pytest.approx(49.024e6 * 18 + activations)
    assert pred.iloc[1] == pytest.approx(49.024e6 * 9 + activations)


def test_physics_is_the_simulator_fitted_to_nothing(vtrain_dataset):
    meta = vtrain_dataset.meta
    rows = meta.iloc[:20]
    physics = REGISTRY["physics"]().fit(meta.iloc[20:]).predict(rows)
    assert np.allclose(physics["pred_time_s"], rows["sim_time_s"], rtol=1e-6)
    fitted = REGISTRY["simulator"]().fit(meta.iloc[20:]).predict(rows)
    assert not np.allclose(fitted["pred_time_s"], physics["pred_time_s"])  # a fitted scale moves it
