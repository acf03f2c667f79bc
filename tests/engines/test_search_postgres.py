"""The plan search's Optuna study in PostgreSQL, shared by three `python -m serve search` processes at once: an
exhaustive study evaluates each plan once between them, a sampled one holds the trials asked for (the study's
count, not each worker's), a worker killed mid-batch and started again loses no plan, and every worker answers as
one search alone does."""

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from serve.api import load_predictor
from serve.schemas import SearchRequest
from serve.search import cli
from serve.search.cli import print_table
from serve.search.space import space_of
from serve.search.storage import lock_key
from serve.search.study import search, study_name
from serve.search.trials import params_of
from tests.serve import conftest as serve_fixtures

pytestmark = [pytest.mark.engines]

REPO = Path(__file__).resolve().parents[2]
# 12 layers on 2 A100s, micro-batches of 1: 84 plans, a round (32 trials) or more for each of three workers
BODY = {
    "workload": serve_fixtures.WORKLOAD,
    "cluster": {**serve_fixtures.CLUSTER, "devices_per_node": 2},
    "micro_batch_sizes": [1],
    "seed": 0,
}
WORKERS = 3
DEADLINE_S = 180  # each worker's; a search of this space takes seconds
S = optuna.trial.TrialState
EVALUATED = (S.COMPLETE, S.PRUNED)
# the study locks (serve.search.storage.exclusive) held or waited for in the test's database
ADVISORY_LOCKS = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


@pytest.fixture
def workers(tmp_path, predictor_path):
    """start(body, url) runs `python -m serve search` on a request; every process started is killed at the end."""
    started: list[subprocess.Popen] = []

    def start(body: dict, url: str) -> subprocess.Popen:
        n = len(started)
        request, log = tmp_path / f"search-{n}.json", tmp_path / f"worker-{n}"
        request.write_text(json.dumps(body))
        command = [sys.executable, "-m", "serve", "search", str(request), "--model", str(predictor_path)]
        # files, not pipes: nobody reads a pipe while the workers run
        with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
            proc = subprocess.Popen([*command, "--storage", url], cwd=REPO, stdout=out, stderr=err, text=True)
        proc.log = log
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _answer(proc: subprocess.Popen) -> str:
    """The worker's table, once it exits (its stderr if it failed)."""
    try:
        rc = proc.wait(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"worker {proc.pid} still searching after {DEADLINE_S} s")
    out, err = Path(f"{proc.log}.out").read_text(), Path(f"{proc.log}.err").read_text()
    assert rc == 0, f"worker {proc.pid} exited {rc}:\n{err[-3000:]}"
    return out


def _study(url: str, deadline_s: float = 60) -> optuna.Study:
    """The one study the workers made in the database (waiting for them to make it)."""
    deadline = time.monotonic() + deadline_s
    while not (names := optuna.study.get_all_study_names(url)):
        assert time.monotonic() < deadline, "no worker made the study"
        time.sleep(0.2)
    (name,) = names
    return optuna.load_study(study_name=name, storage=url)


def _key(trial: optuna.trial.FrozenTrial) -> str:
    return json.dumps(trial.params, sort_keys=True)


def _space_keys(body: dict) -> Counter:
    space = space_of(SearchRequest.model_validate(body))
    return Counter(json.dumps(params_of(s, space), sort_keys=True) for s in space.enumerate())


def _owner(proc: subprocess.Popen) -> str:
    return f"{socket.gethostname()}:{proc.pid}"


@pytest.fixture(scope="module")
def predictor(predictor_path):
    return load_predictor(str(predictor_path))


@pytest.fixture(scope="module")
def alone(predictor) -> str:
    """The exhaustive answer of one search in memory, as the CLI prints it."""
    request = SearchRequest.model_validate(BODY | {"trials": 200, "sampler": "exhaustive"})
    table = io.StringIO()
    with contextlib.redirect_stdout(table):
        print_table(search(predictor, request, None))
    return table.getvalue()


def _start_together(workers, body: dict, url: str, study: str, deadline_s: float = 60) -> list[subprocess.Popen]:
    """WORKERS workers, let into the study's lock once all of them wait for it: each takes a first round before
    any takes a second, however their start-up times differ."""
    engine = sqlalchemy.create_engine(url)
    waiting = sqlalchemy.text(f"{ADVISORY_LOCKS} AND NOT granted")
    try:
        with engine.connect() as db:
            db.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": lock_key(study)})
            procs = [workers(body, url) for _ in range(WORKERS)]
            deadline = time.monotonic() + deadline_s
            while db.execute(waiting).scalar() < WORKERS:
                gone = [Path(f"{p.log}.err").read_text()[-2000:] for p in procs if p.poll() is not None]
                assert time.monotonic() < deadline and not gone, f"workers did not reach the study's lock: {gone}"
                time.sleep(0.1)
            db.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": lock_key(study)})
    finally:
        engine.dispose()
    return procs


def test_three_workers_evaluate_every_plan_of_an_exhaustive_study_once(postgres, workers, predictor, alone):
    url = postgres.database("exhaustive")
    body = BODY | {"trials": 200, "sampler": "exhaustive"}
    name = study_name(SearchRequest.model_validate(body), predictor) + "-all"
    procs = _start_together(workers, body, url, name)
    answers = [_answer(p) for p in procs]
    trials = _study(url).get_trials(deepcopy=False)
    assert Counter(t.state for t in trials) == Counter({S.COMPLETE: sum(_space_keys(body).values())})
    assert Counter(_key(t) for t in trials) == _space_keys(body)  # each plan once, none missing, none sampled
    assert all("fixed_params" in t.system_attrs for t in trials)
    per_worker = Counter(t.user_attrs["owner"] for t in trials)
    assert sorted(per_worker.values()) == [20, 32, 32], per_worker  # a round each first, of the 84 plans
    assert set(per_worker) == {_owner(p) for p in procs}, per_worker
    # each worker answers once the others' trials are in: the answer of one search alone
    assert answers == [alone] * WORKERS, answers


def test_three_workers_of_a_sampled_study_hold_the_trials_asked_between_them(postgres, workers, predictor):
    """trials counts the study's trials: three workers asking 72 each end with 72 between them (asking for more
    adds the difference: tests/serve/test_search.py::test_search_resumes_from_its_storage)."""
    url = postgres.database("sampled")
    body = BODY | {"trials": 72, "sampler": "optuna"}
    procs = _start_together(workers, body, url, study_name(SearchRequest.model_validate(body), predictor))
    answers = [_answer(p) for p in procs]
    trials = _study(url).get_trials(deepcopy=False)
    assert Counter(t.state for t in trials) == Counter({S.COMPLETE: 72})  # none running, waiting, failed
    per_worker = Counter(t.user_attrs["owner"] for t in trials)
    assert sorted(per_worker.values()) == [8, 32, 32], per_worker  # a round each first: 32, 32 and the 8 left
    assert set(per_worker) == {_owner(p) for p in procs}, per_worker
    assert all(a.startswith("time search (optuna): 72 trials") for a in answers), answers
    # a worker joining the study draws from a seed of its own: the same seed would repeat the first worker's draws
    first = {owner: next(_key(t) for t in trials if t.user_attrs["owner"] == owner) for owner in per_worker}
    assert len(set(first.values())) == WORKERS, first


def _pause_mid_batch(url: str, procs: list[subprocess.Popen], deadline_s: float = 60) -> dict:
    """SIGSTOP every worker at a moment when one of them holds RUNNING trials and none holds or waits for the
    study's lock (a paused holder would stall everyone): {worker: the numbers of its RUNNING trials}."""
    study, deadline = _study(url), time.monotonic() + deadline_s
    engine = sqlalchemy.create_engine(url)
    locks = sqlalchemy.text(ADVISORY_LOCKS)
    try:
        while time.monotonic() < deadline:
            if not study.get_trials(deepcopy=False, states=(S.RUNNING,)):
                time.sleep(0.05)
                continue
            for p in procs:
                os.kill(p.pid, signal.SIGSTOP)
            time.sleep(0.2)  # what they sent before stopping reaches the server
            running = study.get_trials(deepcopy=False, states=(S.RUNNING,))
            held = {p: {t.number for t in running if t.user_attrs.get("owner") == _owner(p)} for p in procs}
            with engine.connect() as db:
                free = db.execute(locks).scalar() == 0
            # each RUNNING trial marked: none is half taken from the queue
            if free and any(held.values()) and sum(map(len, held.values())) == len(running):
                return held
            for p in procs:
                os.kill(p.pid, signal.SIGCONT)
            time.sleep(0.1)
    finally:
        engine.dispose()
    pytest.fail(f"no worker held a RUNNING trial outside the lock within {deadline_s} s")


def test_a_worker_killed_mid_batch_and_started_again_loses_no_plan(postgres, workers, alone):
    """The worker started again gives back what the killed one held, once, and leaves alone what the other two
    (alive, paused meanwhile) hold."""
    url = postgres.database("killed")
    body = BODY | {"trials": 200, "sampler": "exhaustive"}
    procs = [workers(body, url) for _ in range(WORKERS)]
    held = _pause_mid_batch(url, procs)
    victim = next(p for p in procs if held[p])
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL
    again = workers(body, url)
    study, deadline = _study(url), time.monotonic() + DEADLINE_S
    while len([t for t in study.get_trials(deepcopy=False) if "retry_of" in t.user_attrs]) < len(held[victim]):
        assert time.monotonic() < deadline and again.poll() is None, "the worker started again requeued nothing"
        time.sleep(0.2)
    live = [p for p in procs if p is not victim]
    for p in live:
        os.kill(p.pid, signal.SIGCONT)
    answers = [_answer(p) for p in live + [again]]

    trials = {t.number: t for t in _study(url).get_trials(deepcopy=False)}
    states = Counter(t.state for t in trials.values())
    assert S.RUNNING not in states and S.WAITING not in states
    assert Counter(_key(t) for t in trials.values() if t.state in EVALUATED) == _space_keys(body)  # each plan once
    # what the killed worker held was given back exactly once, by the worker started again; the live ones' kept
    assert {n for n, t in trials.items() if t.state == S.FAIL} == held[victim]
    retries = [t for t in trials.values() if "retry_of" in t.user_attrs]
    assert sorted(t.user_attrs["retry_of"] for t in retries) == sorted(held[victim])
    assert {t.user_attrs["requeued_by"] for t in retries} == {_owner(again)}
    for p in live:
        assert all(trials[n].state in EVALUATED and trials[n].user_attrs["owner"] == _owner(p) for n in held[p])
    assert answers == [alone] * WORKERS, answers


def test_an_unreachable_database_is_one_line_naming_it_without_its_password(predictor_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://plansight:hunter2@127.0.0.1:{port}/plans"
    with pytest.raises(SystemExit) as exit:  # the message is what Python prints to stderr, with status 1
        cli.main(["--workload", json.dumps(BODY["workload"]), "--cluster", "a100-80gb", "--model", str(predictor_path),
                  "--storage", url])  # fmt: skip
    message = exit.value.code
    shown = f"postgresql://plansight:***@127.0.0.1:{port}/plans"
    assert message.startswith(f"error: cannot open the study storage {shown}: "), message
    assert "Connection refused" in message and "hunter2" not in message and "\n" not in message, message
