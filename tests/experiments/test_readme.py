"""Every command in the README's shell blocks runs, so none can rot: each is run here as written (from the
repository root, with its own MLflow store), or names the test that runs it. A command the README gains without a
test here fails, and so does one this file covers that the README lost. The GPU commands run where CUDA is."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request

import pytest
import torch

from collect import REPO
from collect.sweep import SweepSpec, sample_points

README = REPO / "README.md"
PREDICT = ".venv/bin/python -m serve predict experiments/requests/predict/llama-3.1-8b-fsdp-8xh100.json"
SEARCH = "make search WORKLOAD=experiments/requests/llama-3.1-70b.json CLUSTER=h100-80gb NODES=4"
WORKLOAD = (
    ".venv/bin/python -m collect workload --hf-config experiments/requests/hf/llama-3.1-70b.config.json "
    "--seq-len 8192 --global-batch-size 256"
)
SBATCH = "sbatch --nodes=2 --gres=gpu:8 docs/slurm/collect.sbatch collect/sweeps/gpu-nodes.yaml"
GPU_SWEEP = ".venv/bin/torchrun --nproc_per_node 1 -m collect sweep collect/sweeps/gpu-single.yaml"
# commands another test runs: (that test's file, what of the command it runs)
ELSEWHERE = {
    "make test": (".ci/run", "make test"),
    "make train": ("tests/engines/test_mlflow_server.py", '"gnn.train"'),  # the target's command, on small data
    SBATCH: ("tests/engines/test_slurm.py", "docs/slurm/collect.sbatch"),  # the CPU sweep; the GPU one is below
}
RUN_HERE = {"make demo", PREDICT, f"{PREDICT} --json", WORKLOAD, SEARCH, "make serve", GPU_SWEEP}


def readme_commands() -> list[str]:
    """The commands of the README's ```sh blocks, continuation lines joined."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    return [" ".join(line.split()) for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_every_readme_command_is_run_by_a_test():
    commands = readme_commands()
    covered = RUN_HERE | set(ELSEWHERE)
    assert not set(commands) - covered, f"README commands no test runs: {sorted(set(commands) - covered)}"
    assert not covered - set(commands), (
        f"commands this file covers that the README lost: {sorted(covered - set(commands))}"
    )
    for command, (path, part) in ELSEWHERE.items():
        assert part in (REPO / path).read_text(), f"{path} no longer runs {part} ({command})"


def test_the_readme_is_short_and_its_links_and_the_docs_links_resolve():
    assert len(README.read_text().splitlines()) <= 200, "the README is a front door: reference goes to docs/"
    for page in [README, *(REPO / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links to a missing {target}"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    store = tmp_path_factory.mktemp("readme") / "mlflow.db"
    return {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}", "PYTHONWARNINGS": "ignore"}


def _run(command: str, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    out = subprocess.run(command, shell=True, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{command}\n{out.stderr[-3000:]}"
    return out


def test_predict_prints_the_table_and_the_json(env):
    # JSON first, on a fresh store: registering the shipped champion on first use says so on stderr, not in it
    body = json.loads(_run(f"{PREDICT} --json", env).stdout)
    assert len(body["predictions"]) == 3 and body["calibration"] == "leave-one-source-out"
    rows = [line for line in _run(PREDICT, env).stdout.splitlines() if re.match(r"\s+\d+\s+dp8 ", line)]
    assert len(rows) == 3 and all(" yes " in row or " no " in row for row in rows)


def test_the_hf_config_becomes_a_workload(env):
    workload = json.loads(_run(WORKLOAD, env).stdout)
    assert (workload["layers"], workload["hidden"], workload["seq_len"]) == (80, 8192, 8192)


def test_the_search_and_the_demo_print_their_plans(env):
    assert re.search(r"\n\s+1\s+dp\d+ tp\d+ pp\d+", _run(SEARCH, env).stdout)
    demo = _run("make demo", env, timeout=900).stdout
    assert "[3/3] plan search" in demo and re.search(r"\n\s+1\s+dp\d+ tp\d+ pp\d+", demo)


def test_make_serve_answers_health(env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(f"make serve PORT={port}", shell=True, cwd=REPO, env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    assert r.status == 200
                    return
            except OSError:
                assert server.poll() is None, "make serve exited"
                time.sleep(1)
        pytest.fail("make serve did not answer /health within 300 s")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


@pytest.mark.parametrize("name", ["gpu-nodes", "gpu-single"])
def test_the_gpu_templates_are_sweeps_of_valid_plans(name):
    spec = SweepSpec.from_yaml(REPO / "collect" / "sweeps" / f"{name}.yaml")
    points = sample_points(spec)
    assert spec.device == "cuda" and spec.backend == "nccl" and points
    per_node = spec.devices_per_node or 1
    assert all(p.cluster.world_size in spec.world_sizes and p.cluster.devices_per_node <= per_node for p in points)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU sweep needs CUDA")
def test_the_gpu_sweep_measures_plans(env, tmp_path):
    _run(f"{GPU_SWEEP} --out {tmp_path} --hardware {tmp_path} --limit 3", env, timeout=900)
    assert list(tmp_path.glob("*.parquet"))
