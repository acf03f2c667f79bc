"""docs/slurm/collect.sbatch, submitted to a real SLURM cluster on this host (tests/engines/slurm.py): the CPU
sweep completes with every plan stored once, a resubmission measures nothing new, and a job cancelled mid-sweep
loses no finished row while its resubmission measures the rest, each plan once."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from pandas.testing import assert_frame_equal

from collect.store import ResultStore
from collect.sweep import SweepSpec, measurement_id, schedule_measurements
from tests.engines.slurm import SlurmCluster, slurm_missing

pytestmark = [pytest.mark.engines]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs/slurm/collect.sbatch"
SWEEP = ROOT / "collect/sweeps/slurm-cpu.yaml"
JOB_S = 120  # one job's deadline: torchrun's start-up and a few plans take ~15 s here
IDLE_COUNTS = "{'ok': 0, 'oom': 0, 'error': 0, 'timeout': 0}"
PROGRESS = re.compile(r"^\[\d+\] (\S+-r\d+): (\w+) ", re.MULTILINE)  # collect's line per stored plan


@pytest.fixture(scope="module")
def slurm():
    missing = slurm_missing()
    if missing:
        pytest.skip(missing)
    cluster = SlurmCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("slurm-collect")


def _submit(slurm: SlurmCluster, sweep: Path, out: Path, logs: Path) -> str:
    # as collect.sbatch's header submits the CPU sweep, with the job's log where the test reads it and the rows
    # where PLANSIGHT_OUT says (the job inherits the submitter's environment)
    env = {"PLANSIGHT_RANKS_PER_NODE": "2", "PLANSIGHT_OUT": str(out)}
    return slurm.sbatch(SCRIPT, str(sweep), options=(f"--output={logs}/%x-%j.out",), cwd=ROOT, env=env)


def _log(logs: Path, job: str) -> str:
    return (logs / f"plansight-collect-{job}.out").read_text()


def _expected(sweep: Path) -> set[str]:
    return {measurement_id(p, r) for p, r, _ in schedule_measurements(SweepSpec.from_yaml(sweep))}


def _assert_ended(slurm: SlurmCluster, job: str, state: str, logs: Path) -> None:
    record = slurm.wait(job, JOB_S)
    log = _log(logs, job) if (logs / f"plansight-collect-{job}.out").exists() else ""
    assert record["JobID"] == job and record["State"].startswith(state), f"{record}\n{log[-3000:]}\n{slurm.logs()}"


@pytest.fixture(scope="module")
def first_job(slurm, folder):
    """The CPU sweep as the header of collect.sbatch submits it, into a fresh output folder."""
    out, logs = folder / "runs", folder / "logs"
    logs.mkdir()
    job = _submit(slurm, SWEEP, out, logs)
    _assert_ended(slurm, job, "COMPLETED", logs)
    return job, out, logs


def test_the_sbatch_script_collects_the_cpu_sweep_every_plan_once(slurm, first_job):
    job, out, logs = first_job
    record = slurm.sacct(job)
    assert record["State"] == "COMPLETED" and record["ExitCode"] == "0:0" and record["NodeList"] == slurm.node
    store = ResultStore(out / "slurm-cpu.parquet")
    assert store.parquet_path.exists()  # the job compacted its journal on the way out
    df = store.load()
    expected = _expected(SWEEP)
    assert len(expected) == 5 and df.measurement_id.is_unique and set(df.measurement_id) == expected
    assert (df.status == "ok").all() and (df.world_size == 2).all() and (df.iter_time_s > 0).all()
    log = _log(logs, job)
    assert "1 node(s) x 2 rank(s)" in log
    measured = Counter(PROGRESS.findall(log))
    assert set(measured) == {(mid, "ok") for mid in expected} and set(measured.values()) == {1}
    assert "slurm-cpu: {'ok': 5, 'oom': 0, 'error': 0, 'timeout': 0}" in log


def test_a_second_submission_resumes_and_measures_nothing_new(slurm, first_job):
    _, out, logs = first_job
    store = ResultStore(out / "slurm-cpu.parquet")
    before = store.load().sort_values("measurement_id").reset_index(drop=True)
    job = _submit(slurm, SWEEP, out, logs)
    _assert_ended(slurm, job, "COMPLETED", logs)
    after = store.load().sort_values("measurement_id").reset_index(drop=True)
    assert len(after) == len(before) == 5
    columns = ["measurement_id", "status", "iter_time_s"]
    assert after[columns].equals(before[columns])
    log = _log(logs, job)
    assert not PROGRESS.findall(log) and f"slurm-cpu: {IDLE_COUNTS}" in log


def _rows_on_disk(store: ResultStore) -> int:
    # the journal's complete lines, read without the store's lock or its repairs: the running job owns them
    journal = store.journal_path.read_bytes() if store.journal_path.exists() else b""
    return journal.count(b"\n")


def test_scancel_mid_sweep_loses_no_row_and_a_resubmission_measures_the_rest_once(slurm, folder):
    spec = yaml.safe_load(SWEEP.read_text())
    # more plans, each longer: the job is still measuring when its first row lands and the cancel comes
    spec |= {"name": "slurm-cancel", "num_points": 10, "measure": {"warmup_iters": 0, "timed_iters": 12}}
    sweep, out, logs = folder / "slurm-cancel.yaml", folder / "cancel-runs", folder / "cancel-logs"
    sweep.write_text(yaml.safe_dump(spec))
    logs.mkdir()
    expected = _expected(sweep)
    store = ResultStore(out / "slurm-cancel.parquet")

    first = _submit(slurm, sweep, out, logs)
    deadline = time.monotonic() + JOB_S
    while _rows_on_disk(store) < 1:
        assert time.monotonic() < deadline, f"no row within {JOB_S} s\n{slurm.logs()}"
        assert not slurm.sacct(first), f"job {first} ended before its first row: {slurm.sacct(first)}"
        time.sleep(0.2)
    assert slurm.job_state(first) == "RUNNING"
    slurm.scancel(first)
    _assert_ended(slurm, first, "CANCELLED", logs)

    before = store.load().set_index("measurement_id")
    inflight = store.parquet_path.with_suffix(".inflight")
    crashed = inflight.read_text().strip() if inflight.exists() else None
    if crashed in before.index:  # cancelled between storing the plan and clearing its marker: its row stands
        crashed = None
    assert 1 <= len(before) < len(expected), f"cancelled after {len(before)} of {len(expected)} plans"
    assert (before.status == "ok").all() and set(before.index) <= expected and crashed not in before.index

    second = _submit(slurm, sweep, out, logs)
    _assert_ended(slurm, second, "COMPLETED", logs)
    after = store.load()
    assert after.measurement_id.is_unique and set(after.measurement_id) == expected
    after = after.set_index("measurement_id")
    # every row stored before the cancel is there, as it was
    columns = ["status", "iter_time_s", "peak_mem_bytes", "collected_at"]
    assert_frame_equal(after.loc[before.index, columns], before[columns], check_dtype=False)  # journal vs parquet
    # the plan the cancel cut short is an error row, by design: a plan that killed a job is not retried
    if crashed:
        assert after.loc[crashed, "status"] == "error" and "the job died" in after.loc[crashed, "error"]
    assert (after.drop(index=[crashed] if crashed else []).status == "ok").all()
    # measured once over both jobs: the second measured only what the first had not stored
    first_log, second_log = _log(logs, first), _log(logs, second)
    measured = Counter(mid for mid, _ in PROGRESS.findall(first_log + second_log))
    assert set(measured.values()) == {1}
    assert set(mid for mid, _ in PROGRESS.findall(second_log)) == expected - set(before.index) - {crashed}
    assert f"'ok': {len(expected) - len(before) - bool(crashed)}, 'oom': 0, 'error': 0" in second_log
