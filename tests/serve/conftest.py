"""A real server process over the small trained predictor (tests/conftest.py: predictor_path)."""

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
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


def start_server(predictor_path: Path, *options: str):
    """`python -m serve serve` on a free loopback port, with ``options`` (--slot-wait 1 ...): (process, client)
    once it answers /health."""
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
            *options,
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


def call(base: str, method: str, path: str, body: dict | None = None, timeout: float = 120) -> tuple[int, dict]:
    """One request to the server at ``base``: (status, the JSON it answered), errors included."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def finished(base: str, job_id: str, deadline_s: float = 300) -> dict:
    """GET /searches/{id} until it is no longer queued or running."""
    deadline = time.monotonic() + deadline_s
    while True:
        status, body = call(base, "GET", f"/searches/{job_id}")
        assert status == 200, body
        if body["state"] not in ("queued", "running") or time.monotonic() > deadline:
            return body
        time.sleep(0.2)
