"""A real server process over the small trained predictor (tests/conftest.py: predictor_path)."""

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gnn.inference.predictor import BatchPredictor

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = {
    "layers": 12,
    "hidden": 1024,
    "heads": 16,
    "seq_len": 1024,
    "vocab": 51200,
    "micro_batch_size": 1,
    "global_batch_size": 16,
    "dtype": "bfloat16",
}
CLUSTER = {"preset": "a100-80gb", "devices_per_node": 4}


@pytest.fixture(scope="session")
def predictor(predictor_path) -> BatchPredictor:
    return BatchPredictor.load(predictor_path, REPO / "data" / "hardware")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CLIENT_TIMEOUT_S = 2  # the test servers close stalled connections after this (the default is 10 s)


def start_server(predictor_path: Path):
    """`python -m serve serve` on a free loopback port: (process, client) once it answers /health."""
    port = _free_port()
    # a file, not a pipe: nobody reads a pipe while the tests run, and a full one would block the server
    log = tempfile.NamedTemporaryFile("w+", prefix="plansight-server-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serve",
            "serve",
            "--port",
            str(port),
            "--model",
            str(predictor_path),
            "--client-timeout",
            str(CLIENT_TIMEOUT_S),
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    from serve.client import Client

    client = Client(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 120
    while True:
        try:
            client.health()
            break
        except OSError as e:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"server did not start:\n{Path(log.name).read_text()}") from e
            time.sleep(0.3)
    return proc, client


@pytest.fixture(scope="session")
def server(predictor_path):
    """A server shared by the tests that leave it running; yields its client."""
    proc, client = start_server(predictor_path)
    yield client
    proc.terminate()
    proc.wait(timeout=30)
