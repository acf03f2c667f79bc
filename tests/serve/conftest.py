"""A small trained predictor on the shipped A100 rows, saved to disk, and a real server process over it."""
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gnn.predictor import Predictor
from gnn.splits import named_splits
from gnn.train import TrainConfig, train_ensemble

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = {"layers": 12, "hidden": 1024, "heads": 16, "seq_len": 1024, "vocab": 51200, "micro_batch_size": 1,
            "global_batch_size": 16, "dtype": "bfloat16"}
CLUSTER = {"preset": "a100-80gb", "devices_per_node": 4}


@pytest.fixture(scope="session")
def predictor_path(vtrain_dataset, tmp_path_factory) -> Path:
    parts = named_splits(vtrain_dataset.meta)["a100/random"]
    small = {k: v[:200] for k, v in parts.items()}
    cfg = TrainConfig(max_epochs=4, hidden=16, num_layers=2, batch_size=32, members=2)
    ensemble = train_ensemble(vtrain_dataset, small, cfg, progress=False)
    path = tmp_path_factory.mktemp("model") / "predictor.pt"
    Predictor(ensemble, REPO / "data" / "hardware", {"name": "test-model", "split": "a100/random"}).save(path)
    return path


@pytest.fixture(scope="session")
def predictor(predictor_path) -> Predictor:
    return Predictor.load(predictor_path, REPO / "data" / "hardware")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server(predictor_path):
    """`python -m serve serve` on a free loopback port; yields its base URL."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "serve", "serve", "--port", str(port), "--model", str(predictor_path)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    from serve.client import Client

    client = Client(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 120
    while True:
        try:
            client.health()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"server did not start:\n{proc.stdout.read()}")
            time.sleep(0.3)
    yield client
    proc.terminate()
    proc.wait(timeout=30)
