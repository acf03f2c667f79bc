"""A search's trials in the study's storage: who asked for each, which a killed search left behind, which plans
are still to be queued. Two searches of one study (two processes, or two hosts on one database) share its trials:
each counts what is left each round, and gives back only the trials of a search that is gone."""

from __future__ import annotations

import json
import os
import socket
import time

import optuna
import sqlalchemy.exc

from collect.schema import RunSpec
from serve.search.space import Space
from serve.search.trials import params_of


def open_storage(url: str | None, tries: int = 5) -> optuna.storages.BaseStorage | None:
    """The RDB storage at ``url`` (None: in memory). Two searches starting at once on a new database both create its
    tables and stamp its schema version, and one loses that race (an IntegrityError): it tries again, and then finds
    the tables made."""
    if url is None:
        return None
    for attempt in range(tries):
        try:
            return optuna.storages.RDBStorage(url)
        except sqlalchemy.exc.SQLAlchemyError:
            if attempt == tries - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


WAITING, RUNNING = optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING
OWNER = "owner"  # a trial's user attribute: host:pid of the search that asked for it


def ask(study: optuna.Study) -> optuna.Trial:
    """A trial of the study, marked as this process's."""
    trial = study.ask()
    trial.set_user_attr(OWNER, f"{socket.gethostname()}:{os.getpid()}")
    return trial


def finished(study: optuna.Study) -> int:
    return len(finished_trials(study))


def requeue_abandoned(study: optuna.Study) -> None:
    """Trials left RUNNING by a search that was killed: mark them failed and queue their plans again, as optuna's
    RetryFailedTrialCallback does. A trial whose search is still running (another process on this host, or any
    on another host, which this one cannot check) is left to it: two searches on one study share its trials."""
    for t in study.get_trials(deepcopy=False, states=(RUNNING,)):
        if _owner_alive(t.user_attrs.get(OWNER)):
            continue
        params = t.system_attrs.get("fixed_params") or t.params
        try:
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        except (RuntimeError, ValueError):  # finished meanwhile by its own search after all
            continue
        if params:
            study.enqueue_trial(params, user_attrs={"retry_of": t.number})


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


def enqueue_missing(study: optuna.Study, plans: list[RunSpec], space: Space) -> None:
    """Queue each plan of the space that is neither evaluated nor queued yet."""
    seen = {
        key(t.system_attrs.get("fixed_params") or t.params)
        for t in study.get_trials(
            deepcopy=False,
            states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.WAITING),
        )
    }
    for spec in plans:
        params = params_of(spec, space)
        if key(params) not in seen:
            study.enqueue_trial(params)
            seen.add(key(params))


def key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def count(study: optuna.Study, state) -> int:
    return len(study.get_trials(deepcopy=False, states=(state,)))


def finished_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that were evaluated: complete, or pruned as invalid plans (failed ones were given back)."""
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))


def feasible_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Complete trials within every constraint (serve.search.study: the plan's chance of running out of memory)."""
    return [
        t
        for t in study.trials
        if t.state == optuna.trial.TrialState.COMPLETE and t.constraints and all(c <= 0 for c in t.constraints.values())
    ]
