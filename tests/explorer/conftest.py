"""The plan explorer's tests run against a real server over the shipped champion (models/champion), the model a
fresh clone's `make serve` answers with, so the page shows what a user would see."""

import json
import os
import shutil
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
