"""ruff, configured in pyproject.toml, passes on the whole tree: the same check as `make lint`."""

import subprocess
import sys

from collect import REPO


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True)


def test_ruff_check_passes():
    result = _ruff("check", "--output-format", "concise", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_applied():
    result = _ruff("format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_catches_an_unused_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    result = _ruff("check", "--no-cache", "--config", str(REPO / "pyproject.toml"), str(bad))
    assert result.returncode == 1 and "F401" in result.stdout
