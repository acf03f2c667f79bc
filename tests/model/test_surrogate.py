"""A real (small) GNN ensemble: trained, tracked in a temporary MLflow sqlite store, registered, reloaded."""

from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    from gnn.tracking.runs import setup

    setup("test")


def test_train_track_register_and_reload_identically(vtrain_dataset, small_parts, ensemble, tracking, tmp_path):
    from gnn.tracking.pyfunc import as_input
    from gnn.tracking.registry import CHAMPION, MODEL_NAME
    from gnn.tracking.runs import log_surrogate

    summary = log_surrogate(ensemble, vtrain_dataset, small_parts, "a100/random", {"members": 2}, 1.0, register=True)
    assert "registered as champion" in summary
    run = mlflow.search_runs(experiment_names=["test"]).iloc[0]
    assert np.isfinite(run["metrics.val_selection"]) and run["params.dataset_version"]
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run["run_id"])}
    assert {"plots", "errors.csv", "errors.md", "feature_schema.json"} <= artifacts
    assert mlflow.MlflowClient().get_model_version_by_alias(MODEL_NAME, CHAMPION).run_id == run["run_id"]

    logged = Path(mlflow.artifacts.download_artifacts(f"models:/{MODEL_NAME}@{CHAMPION}", dst_path=str(tmp_path)))
    assert (logged / "artifacts" / "predictor.pt").is_file() and not list(logged.rglob("*.pkl"))  # no pickled code
    model = mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}@{CHAMPION}")
    assert model.metadata.signature is not None
    rows = vtrain_dataset.meta.loc[small_parts["test"][:20]]
    reloaded = model.predict(as_input(rows))
    direct = model.unwrap_python_model().predictor.predict_rows(
        rows.assign(vocab=51200, dtype="bfloat16", sharding="none")
    )
    fresh = ensemble.predict([vtrain_dataset[int(i)] for i in small_parts["test"][:20]])
    assert reloaded.shape[0] == 20
    np.testing.assert_allclose(reloaded["iter_time_s"], direct["iter_time_s"].to_numpy(), rtol=1e-6)
    assert np.all(reloaded["iter_time_lo_s"] <= reloaded["iter_time_s"])
    assert np.all(reloaded["iter_time_s"] <= reloaded["iter_time_hi_s"])
    # the reloaded ensemble is the trained one: identical outputs on the dataset's own graphs
    graphs = [vtrain_dataset[int(i)] for i in small_parts["test"][:20]]
    np.testing.assert_array_equal(
        model.unwrap_python_model().predictor.ensemble.predict(graphs)["iter_time_s"], fresh["iter_time_s"]
    )


def test_a_registered_model_predicts_on_a_fingerprint_collected_after_it_was_trained(
    vtrain_dataset, small_parts, ensemble, tracking, tmp_path, monkeypatch
):
    """Collect, then predict: the model bundles the fingerprints it was trained with, and still finds one that
    `make collect` wrote to data/hardware later."""
    import shutil

    from collect.schema import RunSpec
    from gnn.tracking.registry import CHAMPION, MODEL_NAME
    from gnn.tracking.runs import log_surrogate
    from serve.api import load_predictor

    log_surrogate(ensemble, vtrain_dataset, small_parts, "a100/random", {"members": 2}, 1.0, register=True)
    collected = tmp_path / "hardware"
    collected.mkdir()
    shutil.copy(Path(vtrain_dataset.hardware_dir) / "vm-20261123T123157.json", collected / "vm-20991231T000000.json")
    monkeypatch.setenv("PLANSIGHT_HARDWARE_DIR", str(collected))
    predictor = load_predictor(f"models:/{MODEL_NAME}@{CHAMPION}")
    spec = RunSpec.model_validate(
        {
            "workload": {
                "layers": 2,
                "hidden": 128,
                "heads": 4,
                "seq_len": 64,
                "vocab": 512,
                "micro_batch_size": 2,
                "global_batch_size": 4,
            },
            "plan": {"dp": 2},
            "cluster": {"devices_per_node": 2, "memory_bytes": 2**30},
        }
    )
    out = predictor.predict_columns([spec], "vm-20991231T000000", workers=0)
    assert np.isfinite(out["iter_time_s"]).all()
    with pytest.raises(ValueError, match="no fingerprint vm-20991231T000001.json in"):
        predictor.predict_columns([spec], "vm-20991231T000001", workers=0)


def test_a_saved_model_is_weights_and_loading_runs_no_code_from_the_file(ensemble, tmp_path):
    from gnn.inference.predictor import BatchPredictor

    path = tmp_path / "predictor.pt"
    BatchPredictor(ensemble, info={"name": "t"}).save(path)
    blob = torch.load(path, weights_only=True)
    assert set(blob) == {"format", "description", "info", "state_dict"} and isinstance(blob["description"], str)
    loaded = BatchPredictor.load(path)
    for key, value in ensemble.state_dict().items():  # NaN where a buffer says "unknown" (machine_shift, no sittings)
        torch.testing.assert_close(loaded.ensemble.state_dict()[key], value, rtol=0, atol=0, equal_nan=True, msg=key)

    class Payload:  # what a hostile model file would carry
        def __reduce__(self):
            return (open, (str(tmp_path / "ran"), "w"))

    torch.save({"ensemble": Payload()}, tmp_path / "hostile.pt")
    with pytest.raises(ValueError, match="not a plansight model"):
        BatchPredictor.load(tmp_path / "hostile.pt")
    assert not (tmp_path / "ran").exists()


def test_a_model_saved_by_other_code_is_refused_with_what_to_do(ensemble, tmp_path):
    """A model of the code before the latency terms: five analytical time terms, no f_tp_layer_latency."""
    import json

    from gnn.inference.predictor import BatchPredictor

    path = tmp_path / "predictor.pt"
    BatchPredictor(ensemble, info={"name": "t"}).save(path)
    blob = torch.load(path, weights_only=True)
    fewer_terms = {k: v[:, :5] if k.endswith("time_base.coef") else v for k, v in blob["state_dict"].items()}
    assert any(k.endswith("time_base.coef") for k in fewer_terms)  # the members carry the analytical base
    description = json.loads(blob["description"])
    for member in description["members"]:
        member["feature_names"].remove("f_tp_layer_latency")
    for changed in ({"state_dict": fewer_terms}, {"description": json.dumps(description)}):
        torch.save(blob | changed, tmp_path / "old.pt")
        with pytest.raises(ValueError, match="another version of the code.*train it again on this code"):
            BatchPredictor.load(tmp_path / "old.pt")


def test_champion_is_rescored_when_the_graph_code_changed(
    vtrain_dataset, small_parts, ensemble, tracking, monkeypatch, capsys
):
    from gnn.tracking.registry import champion_selection_now
    from gnn.tracking.runs import log_surrogate

    log_surrogate(ensemble, vtrain_dataset, small_parts, "a100/random", {"members": 2}, 1.0, register=True)
    recorded = champion_selection_now(vtrain_dataset, small_parts, "a100/random")  # same features: the record
    assert "re-scored" not in capsys.readouterr().out
    monkeypatch.setattr(vtrain_dataset, "key", "graph-code-changed")
    rescored = champion_selection_now(vtrain_dataset, small_parts, "a100/random")  # scored again on validation
    assert "re-scored under the current features" in capsys.readouterr().out
    assert recorded is not None and rescored == pytest.approx(recorded, rel=1e-6)  # features unchanged in fact
    # a champion of another graph format
    monkeypatch.setattr("gnn.tracking.registry._input_dims", lambda ensemble: (1, 1))
    assert champion_selection_now(vtrain_dataset, small_parts, "a100/random") == float("inf")
    assert "reads another graph format" in capsys.readouterr().out


def test_every_model_is_a_version_and_only_a_better_one_becomes_champion(tracking):
    from gnn.tracking.registry import CHAMPION, MODEL_NAME, register

    with mlflow.start_run() as run:
        mlflow.log_metric("val_selection", 0.5)
        info = mlflow.pyfunc.log_model(name="model", python_model=_Constant())
    assert register(info.model_uri, "val_selection", 0.5, "features-a")
    assert not register(info.model_uri, "val_selection", 0.6, "features-a")
    with mlflow.start_run():
        mlflow.log_metric("val_selection", 0.4)
        better = mlflow.pyfunc.log_model(name="model", python_model=_Constant())
    assert register(better.model_uri, "val_selection", 0.4, "features-a")
    client = mlflow.MlflowClient()
    champion = client.get_model_version_by_alias(MODEL_NAME, CHAMPION)
    assert int(champion.version) == 3 and champion.run_id != run.info.run_id
    assert len(client.search_model_versions(f"name='{MODEL_NAME}'")) == 3
    # under other features a version's record means nothing: it competes with the champion's re-scored value
    assert not register(info.model_uri, "val_selection", 0.3, "features-b", current=0.2)
    assert register(info.model_uri, "val_selection", 0.25, "features-b", current=0.35)
    assert str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version) == "5"


def test_a_rival_setting_the_alias_first_is_read_again_not_an_error(tracking, monkeypatch):
    """Two trainings registering at once on a server: both find no alias and insert it; the second insert fails
    (a unique key on PostgreSQL). The loser reads again and settles on what the winner set."""
    from gnn.tracking.registry import CHAMPION, MODEL_NAME, register

    real = mlflow.MlflowClient.set_registered_model_alias
    raced = []

    def rival_first(self, name, alias, version):
        if not raced:  # the rival's insert lands first, with the same version, and ours collides with it
            raced.append(version)
            real(self, name, alias, version)
            raise mlflow.exceptions.MlflowException("duplicate key value violates unique constraint")
        real(self, name, alias, version)

    monkeypatch.setattr(mlflow.MlflowClient, "set_registered_model_alias", rival_first)
    with mlflow.start_run():
        info = mlflow.pyfunc.log_model(name="model", python_model=_Constant())
    assert register(info.model_uri, "val_selection", 0.5, "features-a")
    assert raced and str(mlflow.MlflowClient().get_model_version_by_alias(MODEL_NAME, CHAMPION).version) == "1"


class _Constant(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input


def test_intervals_are_calibrated_on_validation(vtrain_dataset, small_parts, ensemble):
    from gnn.model.intervals.conformal import interval_coverage

    val = vtrain_dataset.meta.loc[small_parts["val"]]
    pred = ensemble.predict(vtrain_dataset[torch.as_tensor(small_parts["val"])])
    coverage = interval_coverage(pred["iter_time_lo_s"], pred["iter_time_hi_s"], val["iter_time_s"].to_numpy())
    assert 0.8 <= coverage <= 0.9  # conformal: at least the target on the rows it was fitted on, not far above


def test_median_aggregation_takes_the_middle_member_and_its_spread_ignores_the_one_far_off():
    from gnn.model.ensemble import SPREAD_FLOOR, Ensemble

    raw = np.array([[[0.0, 1.0, 0.0]], [[0.1, 1.2, 0.0]], [[5.0, 9.0, 0.0]]])  # 3 members, 1 plan; one far off
    mean, median = Ensemble([], aggregate="mean").summarize(raw), Ensemble([]).summarize(raw)
    assert median["log_time"][0] == pytest.approx(0.1) and median["log_mem"][0] == pytest.approx(1.2)
    assert mean["log_time"][0] == pytest.approx(5.1 / 3)
    # the median's spread is the members' median absolute deviation from it: 0.1 (|0 - 0.1|, 0, |5 - 0.1|)
    assert median["time_spread"][0] == pytest.approx(0.1 + SPREAD_FLOOR)
    assert mean["time_spread"][0] == pytest.approx(raw[:, 0, 0].std() + SPREAD_FLOOR)
    with pytest.raises(ValueError, match="aggregate"):
        Ensemble([], aggregate="mode")


def test_a_prediction_falls_back_to_physics_only_where_members_disagree_beyond_validation():
    from gnn.model.intervals.conformal import fall_back

    point, base = np.array([1.0, 1.0, 1.0, 1.0]), np.array([0.0, 0.0, 0.0, float("nan")])
    spread, limit = np.array([0.05, 0.1, 0.4, 0.4]), np.full(4, 0.1)
    out = fall_back(point, spread, base, limit)
    assert out[0] == out[1] == 1.0  # within the validation spread: the correction stands
    assert out[2] == pytest.approx(1.0 / 16)  # 4x the limit: 1/16 of the correction
    assert out[3] == 1.0  # no physics base to fall back to
    assert fall_back(point[:1], np.zeros(1), base[:1], np.zeros(1))[0] == 1.0  # one member: no spread, no fallback


def test_time_and_memory_both_fall_back_when_members_disagree():
    from gnn.model.ensemble import Ensemble

    ens = Ensemble([])
    ens.spread_limit.fill_(0.1)
    agree = np.array([[[1.0, 2.0, 0.0]], [[1.0, 2.0, 0.0]]])  # 2 members, 1 plan, no spread
    apart = np.array([[[0.6, 1.6, 0.0]], [[1.4, 2.4, 0.0]]])  # same mean, spread 0.4 = 4x the limit
    base, domains = np.zeros((1, 2)), np.zeros(1, dtype=int)
    kept, faded = ens.summarize(agree, base, domains), ens.summarize(apart, base, domains)
    assert kept["log_time"][0] == pytest.approx(1.0) and kept["log_mem"][0] == pytest.approx(2.0)
    assert faded["log_time"][0] == pytest.approx(1.0 / 16) and faded["log_mem"][0] == pytest.approx(2.0 / 16)


def test_calibration_fits_the_spread_limit_from_validation(vtrain_dataset, small_parts, ensemble):
    from gnn.predictors.surrogate import calibrate_ensemble

    calibrate_ensemble(ensemble, vtrain_dataset, small_parts)
    limit = ensemble.spread_limit.numpy()
    assert np.isfinite(limit[1, 0]) and limit[1, 0] > 0  # A100 rows: the 99th percentile of the members' spread


def test_each_hardware_domain_gets_its_own_interval_factor(vtrain_dataset, small_parts, ensemble, tmp_path):
    """A domain whose runs the members predict worse gets wider intervals, not a factor pooled with a better one."""
    import copy

    from gnn.inference.predictor import BatchPredictor
    from gnn.model.ensemble import MIN_CALIBRATION_ROWS
    from gnn.model.intervals.conformal import interval_coverage

    ens, idx = copy.deepcopy(ensemble), small_parts["val"]
    val, graphs, n = vtrain_dataset.meta.loc[idx], vtrain_dataset[torch.as_tensor(idx)], len(idx)
    domains = ["a100"] * (n - MIN_CALIBRATION_ROWS - 5) + ["h100"] * MIN_CALIBRATION_ROWS + ["b200"] * 5
    # the "h100" rows measured 10-40% slower than the A100 rows they copy: errors the pooled factor would hide
    slower = np.where(np.array(domains) == "h100", np.log(np.linspace(1.1, 1.4, n)), 0.0)
    measured = val["iter_time_s"].to_numpy() * np.exp(slower)
    ens.calibrate(graphs, np.log(measured), np.full(n, np.nan), domains)
    assert ens.domain_names == ["a100", "h100"]  # b200: too few rows for a factor of its own
    k_a100, k_h100 = ens.k_domain[:, 0].tolist()
    assert k_h100 > 2 * k_a100
    pred = ens.predict(graphs, domains=domains)
    for name in ("a100", "h100"):
        rows = np.array(domains) == name
        assert interval_coverage(pred["iter_time_lo_s"][rows], pred["iter_time_hi_s"][rows], measured[rows]) >= 0.8
    # fewer rows than MIN_CALIBRATION_ROWS, an unknown domain, or none named: the device class's factor
    assert (ens.interval_factors(np.ones(3, dtype=int), ["b200", "v100", "h100"])[:2] == ens.k.numpy()[1]).all()
    assert (ens.interval_factors(np.ones(1, dtype=int)) == ens.k.numpy()[1]).all()
    BatchPredictor(ens, info={"name": "t"}).save(tmp_path / "p.pt")
    loaded = BatchPredictor.load(tmp_path / "p.pt").ensemble
    assert loaded.domain_names == ens.domain_names and torch.equal(loaded.k_domain, ens.k_domain)


def test_a_misspelt_loss_or_time_base_is_refused_not_trained_with_another():
    from gnn.predictors.surrogate import TrainConfig

    for field, value in (("loss", "L1"), ("time_base", "analytic")):
        with pytest.raises(ValueError, match=f"TrainConfig.{field} must be one of"):
            TrainConfig(**{field: value})
    assert TrainConfig(loss="mse", time_base="simulator").loss == "mse"
