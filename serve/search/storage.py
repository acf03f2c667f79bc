"""A search's trials in the study's storage: who asked for each, which a killed search left behind, which plans
are still to be queued. Two searches of one study (two processes, or two hosts on one database) share its trials:
each takes its trials under the study's lock (``exclusive``), and gives back only the trials of a search that is
gone."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import time

import optuna
import sqlalchemy
import sqlalchemy.exc

from collect.schema import RunSpec
from serve.search.space import Space
from serve.search.trials import params_of


class StorageUnavailable(RuntimeError):
    """The study's database cannot be opened: the message names it (without its password) and why, in one line."""


def open_storage(url: str | None, tries: int = 5) -> optuna.storages.BaseStorage | None:
    """The RDB storage at ``url`` (None: in memory). Two searches starting at once on a new database both create its
    tables and stamp its schema version, and one loses that race (an error from a statement): it tries again, and
    then finds the tables made. A database that cannot be reached is said at once (StorageUnavailable)."""
    if url is None:
        return None
    for attempt in range(tries):
        try:
            return optuna.storages.RDBStorage(url)
        except sqlalchemy.exc.SQLAlchemyError as e:
            # no statement: the connection itself failed (refused, no such database, bad URL), which retrying won't mend
            if getattr(e, "statement", None) is None or attempt == tries - 1:
                raise StorageUnavailable(f"cannot open the study storage {_shown(url)}: {_cause(e)}") from e
            time.sleep(0.2 * (attempt + 1))


def _shown(url: str) -> str:
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return "(a URL SQLAlchemy cannot read)"


def _cause(e: sqlalchemy.exc.SQLAlchemyError) -> str:
    lines = str(getattr(e, "orig", None) or e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


@contextlib.contextmanager
def exclusive(storage: optuna.storages.BaseStorage | None, name: str):
    """Held by one search of study ``name`` at a time, across processes (and hosts, on PostgreSQL): what a search
    reads and then writes on what it read (the plans still to queue, the trials still to ask) must not interleave
    with another's, or both queue the same plan. A killed holder's lock goes with its connection or file."""
    engine = getattr(storage, "engine", None)  # optuna's RDBStorage; in memory: one process's study, no one to wait
    dialect = engine.dialect.name if engine is not None else None
    if dialect == "postgresql":
        with engine.begin() as connection:  # the lock lasts until this transaction ends
            connection.execute(sqlalchemy.text("SELECT pg_advisory_xact_lock(:key)"), {"key": lock_key(name)})
            yield
    elif dialect == "sqlite" and engine.url.database not in (None, "", ":memory:"):
        # a file beside the database: SQLite's own write lock would also stop this process's optuna connection, and
        # a lock on the database file itself would be dropped by SQLite's closing of its own descriptors
        with open(f"{engine.url.database}.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield
    else:
        yield


def lock_key(name: str) -> int:
    """The PostgreSQL advisory lock of study ``name`` (pg_locks shows who holds it and who waits)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


WAITING, RUNNING = optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)  # evaluated (failed ones were given back)
OWNER = "owner"  # a trial's user attribute: host:pid of the search that asked for it


def _me() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def ask(study: optuna.Study) -> optuna.Trial:
    """A trial of the study (a queued one first, else a new one), marked as this process's."""
    trial = study.ask()
    trial.set_user_attr(OWNER, _me())
    return trial


def claim_queued(study: optuna.Study, n: int) -> list[optuna.Trial]:
    """Up to ``n`` queued trials, now RUNNING and this process's; never a new one. Study.ask reads the queue once per
    trial, and when another search took the last queued trial in between, it makes a new, sampled trial: a plan an
    exhaustive search would then evaluate twice."""
    trials = []
    for t in study.get_trials(deepcopy=False, states=(WAITING,)):
        if len(trials) == n:
            break
        # as Study.ask pops a queued trial, through the study's storage: False (or the error) if another search took it
        try:
            if not study._storage.set_trial_state_values(t._trial_id, state=RUNNING):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        trial = optuna.Trial(study, t._trial_id)
        trial.set_user_attr(OWNER, _me())
        trials.append(trial)
    return trials


def finished(study: optuna.Study) -> int:
    return len(finished_trials(study))


def requeue_abandoned(study: optuna.Study, own: bool = True) -> int:
    """Trials left RUNNING by a search that was killed: mark them failed and queue their plans again, as optuna's
    RetryFailedTrialCallback does; how many. A trial whose search is still running (another process on this host,
    or any on another host, which this one cannot check) is left to it: two searches on one study share its
    trials. ``own``: this process's RUNNING trials too (left by an earlier search of it that was interrupted).
    Run under ``exclusive``, each abandoned trial is given back once, however many searches look."""
    requeued = 0
    for t in study.get_trials(deepcopy=False, states=(RUNNING,)):
        owner = t.user_attrs.get(OWNER)
        if _owner_alive(owner) or (not own and owner == _me()):
            continue
        params = t.system_attrs.get("fixed_params") or t.params
        try:
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        except (RuntimeError, ValueError):  # finished meanwhile by its own search after all
            continue
        if params:
            study.enqueue_trial(params, user_attrs={"retry_of": t.number, "requeued_by": _me()})
            requeued += 1
    return requeued


def _owner_alive(owner: str | None) -> bool:
    """Whether the search that asked for a trial still runs: its process, on this host; assumed so elsewhere."""
    if not owner or ":" not in owner:
        return False  # asked before owners were recorded: only a killed search leaves those
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname():
        return True
    if int(pid) == os.getpid():
        return False  # this process's own trials from an earlier search it abandoned
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def enqueue_missing(study: optuna.Study, plans: list[RunSpec], space: Space) -> int:
    """Queue each plan of the space that is neither evaluated, queued nor being evaluated yet (by a live search:
    run after requeue_abandoned, under ``exclusive``); how many."""
    seen = {
        key(t.system_attrs.get("fixed_params") or t.params)
        for t in study.get_trials(deepcopy=False, states=(*FINISHED, WAITING, RUNNING))
    }
    queued = 0
    for spec in plans:
        params = params_of(spec, space)
        if key(params) not in seen:
            study.enqueue_trial(params)
            seen.add(key(params))
            queued += 1
    return queued


def key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def count(study: optuna.Study, *states) -> int:
    return len(study.get_trials(deepcopy=False, states=states))


def finished_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that were evaluated: complete, or pruned as invalid plans (failed ones were given back)."""
    return study.get_trials(deepcopy=False, states=FINISHED)


def feasible_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Complete trials within every constraint (serve.search.study: the plan's chance of running out of memory)."""
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state == optuna.trial.TrialState.COMPLETE and t.constraints and all(c <= 0 for c in t.constraints.values())
    ]
