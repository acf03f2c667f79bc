"""The champion shipped in models/champion: it reads this code's features and reproduces the predictions it made
when it was exported, and a fresh tracking store gets it registered on first use."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from collect import REPO
from gnn.inference import new_source
from gnn.inference.predictor import BatchPredictor
from gnn.tracking.shipped import SHIPPED, local_store, recalibrate, reference_problems, register_shipped

STALE = "the shipped champion (models/champion) is stale for this code: run `make train`, then `make ship-champion`"


def assert_current(folder):
    try:
        problems = reference_problems(folder)
    except ValueError as e:  # another feature layout, or a file this code does not read
        problems = [str(e).splitlines()[0]]
    assert not problems, f"{STALE}\n" + "\n".join(problems)


def test_the_shipped_champion_reproduces_its_reference_predictions():
    assert_current(SHIPPED)


def test_recalibrating_refits_the_new_cluster_calibration_and_keeps_the_weights(tmp_path):
    """make recalibrate: leave-one-source-out rows (here without vTrain's, so the calibration moves) refit what a
    GPU cluster never trained on is told, the weights stay, and the reference predictions are the new ones."""
    import pandas as pd  # lazy: only this test reads the rows

    for name in ("predictor.pt", "champion.json"):
        shutil.copy(SHIPPED / name, tmp_path / name)
    rows = pd.read_csv(REPO / "experiments" / "results" / "loso_rows.csv")
    rows[rows["source"] != "vtrain"].to_csv(tmp_path / "rows.csv", index=False)
    recalibrate(tmp_path / "rows.csv", tmp_path)
    want = new_source.fit(pd.read_csv(tmp_path / "rows.csv"))
    meta = json.loads((tmp_path / "champion.json").read_text())
    before, after = (BatchPredictor.load(f / "predictor.pt") for f in (SHIPPED, tmp_path))
    assert after.info["new_source"] == meta["new_source"] == want != before.info["new_source"]
    weights = (after.ensemble.state_dict(), before.ensemble.state_dict())
    torch.testing.assert_close(*weights, rtol=0, atol=0, equal_nan=True)  # NaN: a prior no sitting could give
    assert meta["recalibrated"]["rows"] == str(tmp_path / "rows.csv")
    assert_current(tmp_path)


@pytest.mark.parametrize("recipe", sorted((REPO / "experiments" / "requests" / "predict").glob("torchtitan-*.json")))
def test_torchtitans_published_recipes_are_predicted_to_fit_their_gpus(recipe):
    """torchtitan's Llama 3.1 70B (256 H100s) and 405B (512 H100s) recipes, which ran on 80 GB GPUs, as the issue
    that once saw them at 185-274 GiB tried them: FSDP, tp 8 with sequence parallelism, full recompute, FP8."""
    from serve.api import predict  # lazy: the service's modules load only for the tests that use them
    from serve.schemas import PredictRequest  # lazy: as above

    response = predict(
        BatchPredictor.load(SHIPPED / "predictor.pt"), PredictRequest.model_validate_json(recipe.read_text())
    )
    assert response.predictions and all(p.fits and p.peak_mem_bytes < 70 * 2**30 for p in response.predictions)


def _copy(tmp_path, scale: float):
    shutil.copy(SHIPPED / "predictor.pt", tmp_path / "predictor.pt")
    meta = json.loads((SHIPPED / "champion.json").read_text())
    meta["reference"][-1]["prediction"]["iter_time_s"] *= scale
    (tmp_path / "champion.json").write_text(json.dumps(meta))
    return tmp_path, meta["reference"][-1]["name"]


def test_the_check_fails_on_a_reference_the_model_does_not_reproduce(tmp_path):
    folder, name = _copy(tmp_path, 1.01)
    with pytest.raises(AssertionError, match="make train`, then `make ship-champion") as failed:
        assert_current(folder)
    assert f"{name}: iter_time_s" in str(failed.value)
    folder, _ = _copy(tmp_path, 1 + 1e-4)  # within the tolerance
    assert_current(folder)


def test_another_feature_layout_is_stale_and_not_registered(tmp_path, monkeypatch, capsys):
    def other_layout(self, names):
        raise ValueError("this model was trained on another feature layout (30 pass and 57 plan features; ...)")

    monkeypatch.setattr(BatchPredictor, "_check_layout", other_layout)
    folder, _ = _copy(tmp_path, 1.0)
    with pytest.raises(AssertionError, match="stale"):
        assert_current(folder)
    assert register_shipped(folder) is False  # before any MLflow call: the caller trains
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "is for another feature layout" in out[0]


CHILD = """
import json, sys
from serve.api import load_predictor, predict
from serve.schemas import PredictRequest
import mlflow

predictor = load_predictor("models:/plansight@champion")
ref = json.loads(sys.argv[1])
spec = ref["spec"]
request = PredictRequest(workload=spec["workload"], cluster={"preset": ref["hardware"]}, plans=[spec["plan"]])
versions = mlflow.MlflowClient().search_model_versions("name='plansight'")
print(json.dumps({
    "version": predictor.info["version"],
    "versions": len(versions),
    "iter_time_s": predict(predictor, request).predictions[0].iter_time_s,
}))
"""


def test_a_fresh_store_registers_the_shipped_champion_once(tmp_path):
    """In processes of their own: mlflow.set_tracking_uri writes os.environ, which would leak into other tests."""
    meta = json.loads((SHIPPED / "champion.json").read_text())
    ref = next(r for r in meta["reference"] if r["hardware"] == "h100-80gb")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_REGISTRY_URI", "MLFLOW_TRACKING_URI")}
    env |= {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "PYTHONPATH": str(REPO)}

    def run():
        done = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(ref)], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        (answer,) = done.stdout.strip().splitlines()  # the answer alone: what it said went to stderr
        return json.loads(answer), [line for line in done.stderr.splitlines() if line.startswith("registered ")]

    first, said = run()
    assert len(said) == 1 and said[0].startswith("registered the shipped champion (trained at ")
    assert said[0].endswith("as models:/plansight@champion version 1")
    assert first["version"] == 1 and first["versions"] == 1
    assert first["iter_time_s"] == pytest.approx(ref["prediction"]["iter_time_s"], rel=1e-3)
    again, said = run()
    assert said == [] and again["version"] == 1 and again["versions"] == 1
    assert (tmp_path / "mlruns").is_dir()  # the artifacts went to the store's folder, not the repository's


@pytest.mark.parametrize(
    ("tracking", "registry", "local"),
    [
        ("sqlite:///x/mlflow.db", None, True),
        ("http://mlflow.team:5000", None, False),
        ("sqlite:///x/mlflow.db", "http://mlflow.team:5000", False),
    ],
)
def test_only_a_local_store_gets_the_shipped_champion_unasked(monkeypatch, tracking, registry, local):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)
    if registry is None:
        monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_REGISTRY_URI", registry)
    assert local_store() is local
