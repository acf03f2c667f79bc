"""MLflow as a team runs it: `mlflow server` on a PostgreSQL store with a local artifact folder. Training logs and
registers through it, the service answers from the champion it holds, two trainings registering at once both
land, and a server that stops mid-training is a clear error that registers nothing."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow
import pytest

from gnn.tracking.registry import CHAMPION, MODEL_NAME
from tests.engines.services import MlflowServer, free_port

pytestmark = pytest.mark.engines

REPO = Path(__file__).resolve().parents[2]
# one small member on the vTrain rows: what is under test is the tracking, not the model
TRAIN = ["--members", "1", "--no-checks", "--max-epochs", "2"]


def _env(url: str) -> dict:
    """The server as both tracking and registry store (a registry URI left in the environment would win); two
    tries, not MLflow's seven with growing waits: a stopped server is reported in seconds, not minutes."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_REGISTRY_URI"}
    return {**env, "MLFLOW_TRACKING_URI": url, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}


def _train(url: str, data: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "gnn.train", "--data", str(data), *TRAIN, *extra]
    return subprocess.Popen(cmd, cwd=REPO, env=_env(url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _server(postgres, tmp_path, name: str) -> MlflowServer:
    return MlflowServer(postgres.database(name), tmp_path / f"{name}-artifacts").start()


def test_make_train_logs_and_registers_on_the_server_and_the_service_answers_from_it(postgres, vtrain_root, tmp_path):
    server = _server(postgres, tmp_path, "mlflow_one")
    try:
        args = f"TRAIN_ARGS=--data {vtrain_root} {' '.join(TRAIN)}"
        train = subprocess.run(["make", "train", f"MLFLOW_TRACKING_URI={server.url}", args], cwd=REPO,
                               env=_env(server.url), capture_output=True, text=True, timeout=600)  # fmt: skip
        assert train.returncode == 0, train.stderr[-3000:]
        assert "registered as champion" in train.stdout
        client = mlflow.MlflowClient(server.url)
        champion = client.get_model_version_by_alias(MODEL_NAME, CHAMPION)
        assert client.get_run(champion.run_id).data.metrics["val_selection"] > 0
        assert any((tmp_path / "mlflow_one-artifacts").rglob("predictor.pt"))  # the artifacts went to the server

        spec = {"workload": json.loads((REPO / "experiments/requests/gpt-20l-1536.json").read_text()),
                "cluster": {"preset": "a100-80gb"},
                "plans": [{"dp": 8, "num_microbatches": 8}, {"dp": 4, "tp": 2, "num_microbatches": 16}]}  # fmt: skip
        (tmp_path / "spec.json").write_text(json.dumps(spec))
        predict = subprocess.run(
            [sys.executable, "-m", "serve", "predict", str(tmp_path / "spec.json"), "--model", f"models:/{MODEL_NAME}"
             f"@{CHAMPION}", "--json"], cwd=REPO, env=_env(server.url), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert predict.returncode == 0, predict.stderr[-3000:]
        answer = json.loads(predict.stdout)
        assert answer["model"]["run_id"] == champion.run_id
        assert len(answer["predictions"]) == 2 and all(p["iter_time_s"] > 0 for p in answer["predictions"])
        _mlflow_models_serve_answers(server.url, tmp_path)
    finally:
        server.stop()


def _mlflow_models_serve_answers(url: str, tmp_path: Path) -> None:
    """`make mlflow-serve` (docs/scale-out.md): MLflow's scoring server, answering its own input example over HTTP."""
    port = free_port()
    serving = subprocess.Popen(["make", "mlflow-serve", f"PORT={port}"], cwd=REPO, env=_env(url),
                               stdout=open(tmp_path / "mlflow-serve.log", "w"), stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip
    try:
        # in a process of its own: mlflow.set_tracking_uri and set_registry_uri write this process's environment,
        # which every later subprocess of the tests would inherit
        uri, into = f"models:/{MODEL_NAME}@{CHAMPION}", tmp_path / "model"
        fetch = f"import mlflow; mlflow.artifacts.download_artifacts({uri!r}, dst_path={str(into)!r})"
        subprocess.run([sys.executable, "-c", fetch], env=_env(url), check=True, capture_output=True, timeout=120)
        body = (into / "serving_input_example.json").read_bytes()
        deadline, answer = time.monotonic() + 240, None
        while answer is None and time.monotonic() < deadline and serving.poll() is None:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", body,
                                                 {"Content-Type": "application/json"})  # fmt: skip
                with urllib.request.urlopen(request, timeout=30) as r:
                    answer = json.loads(r.read())
            except OSError:
                time.sleep(1)
        assert answer is not None, (tmp_path / "mlflow-serve.log").read_text()[-3000:]
        assert all(p["iter_time_s"] > 0 for p in answer["predictions"])
    finally:
        os.killpg(serving.pid, signal.SIGTERM)
        serving.wait(timeout=30)


def test_two_trainings_registering_at_once_both_land_and_the_better_is_champion(postgres, vtrain_root, tmp_path):
    server = _server(postgres, tmp_path, "mlflow_two")
    try:
        trainings = [_train(server.url, vtrain_root, "--seed", str(seed)) for seed in (0, 1)]
        outputs = [t.communicate(timeout=600) for t in trainings]
        assert [t.returncode for t in trainings] == [0, 0], "\n".join(err[-2000:] for _, err in outputs)
        client = mlflow.MlflowClient(server.url)
        versions = client.search_model_versions(f"name='{MODEL_NAME}'")
        assert len(versions) == 2
        scores = {v.version: client.get_run(v.run_id).data.metrics["val_selection"] for v in versions}
        champion = client.get_model_version_by_alias(MODEL_NAME, CHAMPION)
        assert scores[champion.version] == min(scores.values())
        assert sum("registered as champion" in out for out, _ in outputs) >= 1
    finally:
        server.stop()


def test_a_server_stopped_mid_training_is_a_clear_error_and_registers_nothing(postgres, vtrain_root, tmp_path):
    store = postgres.database("mlflow_stop")
    server = MlflowServer(store, tmp_path / "artifacts").start()
    training = _train(server.url, vtrain_root)
    try:
        client, deadline = mlflow.MlflowClient(server.url), time.monotonic() + 120
        while client.get_experiment_by_name("plansight") is None and time.monotonic() < deadline:
            time.sleep(0.5)  # until the training has reached the server: then it loads its graphs and trains
        server.stop()
        out, err = training.communicate(timeout=600)
    finally:
        training.kill()
    assert training.returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the MLflow tracking server") and server.url in last, err[-3000:]
    assert "Traceback" not in err
    again = MlflowServer(store, tmp_path / "artifacts").start()  # the same store, on another port
    try:
        client = mlflow.MlflowClient(again.url)
        assert client.search_model_versions(f"name='{MODEL_NAME}'") == []
        with pytest.raises(mlflow.exceptions.MlflowException):
            client.get_model_version_by_alias(MODEL_NAME, CHAMPION)
    finally:
        again.stop()
