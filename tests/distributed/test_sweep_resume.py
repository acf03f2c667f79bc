"""A sweep killed mid-way resumes with no duplicate and no lost rows."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from collect.store import ResultStore
from collect.sweep import SweepSpec, measurement_id, schedule_measurements

pytestmark = pytest.mark.distributed

SWEEP = {
    "name": "resume-test",
    "shapes": [{"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "vocab": 64}],
    "world_sizes": [1, 2],
    "micro_batch_sizes": [1],
    "num_microbatches": [1, 2],
    "sampler": "random",
    "num_points": 8,
    "repeat_fraction": 0.25,
    "reference_every": 4,
    "deadline_s": 60,
    "measure": {"warmup_iters": 0, "timed_iters": 1, "memory_window_iters": 1},
    "profile_blocks": False,  # a minute per session; nothing models these rows (tests/distributed/test_blocks.py)
}


def _start(tmp_path: Path, sweep_path: Path, command=("collect", "sweep")) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        command[0],
        *command[1:],
        str(sweep_path),
        "--out",
        str(tmp_path / "runs"),
        "--hardware",
        str(tmp_path / "hw"),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def test_killed_sweep_resumes_without_duplicates_or_losses(tmp_path):
    sweep_path = tmp_path / "sweep.yaml"
    sweep_path.write_text(yaml.safe_dump(SWEEP))
    store = ResultStore(tmp_path / "runs" / "resume-test.parquet")
    proc = _start(tmp_path, sweep_path)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if store.journal_path.exists() and len(store.journal_path.read_bytes().splitlines()) >= 4:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "sweep finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the parent and its ranks, mid-plan, no clean-up
    proc.wait()
    partial = store.load()
    assert 4 <= len(partial)

    resumed = _start(tmp_path, sweep_path)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out.decode()[-2000:]
    assert b"resuming:" in out

    df = store.load()
    expected = {measurement_id(p, k) for p, k, _ in schedule_measurements(SweepSpec.model_validate(SWEEP))}
    plans = df[~df.is_reference]
    assert plans.measurement_id.is_unique and set(plans.measurement_id) == expected
    assert set(partial.measurement_id) <= set(df.measurement_id)  # nothing measured before the kill is lost
    assert (tmp_path / "runs" / "resume-test.sweep.json").exists()
    assert len(list((tmp_path / "hw").glob("*.json"))) == 2  # one fingerprint per session


def test_stopped_active_sweep_resumes_and_keeps_to_its_budget(tmp_path):
    active = {**SWEEP, "name": "active-test", "sampler": "active", "budget_runs": 6, "check_runs": 4,
              "seed_runs": 2, "batch_size": 2, "num_microbatches": [1, 2, 4]}  # fmt: skip
    sweep_path = tmp_path / "sweep.yaml"
    sweep_path.write_text(yaml.safe_dump(active))
    store = ResultStore(tmp_path / "runs" / "active-test.parquet")
    first = _start(tmp_path, sweep_path, ("gnn.acquire", "--limit", "5"))  # stops inside the seed set
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out.decode()[-2000:]
    partial = store.load()
    assert len(partial[~partial.is_reference.astype(bool)]) == 5

    resumed = _start(tmp_path, sweep_path, ("gnn.acquire",))
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out.decode()[-2000:]
    assert b"resuming:" in out and b"the budget is spent" in out

    df = store.load()
    plans = df[~df.is_reference.astype(bool)]
    assert plans.run_id.is_unique and set(partial.measurement_id) <= set(df.measurement_id)
    assert plans.active_role.value_counts().to_dict() == {"check": 4, "acquired": 4, "seed": 2}
    assert (plans.status == "ok").all()


def test_a_second_sweep_on_the_same_output_is_refused(tmp_path):
    sweep_path = tmp_path / "sweep.yaml"
    sweep_path.write_text(yaml.safe_dump(SWEEP))
    first = _start(tmp_path, sweep_path)
    lock = tmp_path / "runs" / "resume-test.lock"
    try:
        deadline = time.time() + 120
        while not (lock.exists() and lock.read_text().startswith("pid")):
            assert first.poll() is None and time.time() < deadline, "the first sweep never took the store"
            time.sleep(0.1)
        second = _start(tmp_path, sweep_path)
        out, _ = second.communicate(timeout=120)
        assert second.returncode == 2, out.decode()[-2000:]
        assert f"being written by pid {first.pid}" in out.decode() and b"Traceback" not in out
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
