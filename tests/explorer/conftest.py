"""The plan explorer's tests run against a real server over the shipped champion (models/champion), the model a
fresh clone's `make serve` answers with, so the page shows what a user would see."""

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.serve.conftest import start_server

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "models" / "champion" / "predictor.pt"
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
# the question the page must answer: which plan for Llama 3.1 70B on 4 nodes of 8 H100s
LLAMA_70B = json.loads((REPO / "experiments" / "requests" / "llama-3.1-70b.json").read_text())
REQUEST = {
    "workload": LLAMA_70B,
    "cluster": {"preset": "h100-80gb", "nodes": 4},
    "framework": "torch",
    "objective": "time",
    "trials": 200,
    "top_k": 10,
}


@pytest.fixture(scope="session")
def explorer():
    """The base URL of a server over the shipped champion."""
    proc, client = start_server(SHIPPED)
    yield client.base_url
    proc.terminate()
    proc.wait(timeout=30)


def call(base: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
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


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Debian's chromium (make browser installs it); without it or Playwright the browser tests skip, saying how."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("no Playwright: `make install` installs the pinned one")
    found = os.environ.get("PLANSIGHT_CHROMIUM") or next(filter(None, map(shutil.which, CHROMIUM)), None)
    if not found:
        pytest.skip("no chromium: `make browser` installs Debian's (apt-get, as root), or set PLANSIGHT_CHROMIUM")
    return found
