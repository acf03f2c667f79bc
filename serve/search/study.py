"""Search the plan space with Optuna through the surrogate.

    python -m serve.search.study SEARCH.json [--model models:/plansight@champion] [--storage sqlite:///optuna.db]
    make search WORKLOAD=... CLUSTER=...

SEARCH.json holds a SearchRequest: {"workload": {...}, "cluster": {"preset": "a100-80gb", "nodes": 2},
"objective": "time" | "pareto", "trials": 200}. Single objective: minimise
predicted iteration time, with the chance of running out of memory (oom_risk,
read from the memory interval) at most max_oom_risk as an Optuna constraint
(infeasible trials stay in the study, marked, and steer the sampler away): a
plan whose interval reaches past capacity is one the model cannot vouch for,
and is not picked. Pareto: time vs peak memory with NSGA-II under the same
constraint. Parameters are sampled conditionally (schedules only with pp > 1,
sequence parallel only with tp > 1), so almost
every trial is a valid plan; the rest are recorded as pruned with the reason.
Trials are asked and told in batches so the surrogate predicts many at once.
When the whole space fits in the trial budget (sampler "auto", the default),
every plan is enqueued as a trial instead: the exact optimum for the same
number of surrogate calls (TPE needed more than half of a 312-plan space to
come within 2% of the optimum in 1 of 3 seeds: experiments/search_vs_enum.py).
The study lives in RDB storage under a name derived from the request and the
model, so re-running the same search resumes it, and several searches (processes,
hosts on one PostgreSQL database) of one request share it: they take its trials in
turn (serve.search.storage.exclusive), trials counts the study's trials, not each
search's, and each answers once every trial of the study is evaluated.
"""

from __future__ import annotations

import hashlib
import json
import math
import time

import optuna
from tqdm import tqdm

from collect import REPO
from collect.schema import RunSpec
from gnn.inference.predictor import BatchPredictor
from serve.api import model_summary, predictions
from serve.schemas import MAX_SEARCH_TRIALS, SearchRequest, SearchResponse, SearchResult
from serve.search import storage as stored
from serve.search.space import Space, SpaceStopped
from serve.search.storage import feasible_trials, finished_trials
from serve.search.trials import suggest

DEFAULT_STORAGE = f"sqlite:///{REPO / 'optuna.db'}"
# trials taken per round: the sampler learns from each round's results, and a round's trials are one search's, so
# small rounds share a study among searches; bigger ones would not save much (the surrogate predicts 32 plans in
# about 50 ms, the storage takes about 80 ms per trial)
BATCH = 32
# a study in memory (the HTTP service's) has no other search to share with: its exhaustive rounds stay big, since
# each round is one call of the surrogate
EXHAUSTIVE_BATCH = 256
POLL_S = 0.5  # a search with nothing left to ask looks again this often for the trials other searches still run
STALLED_S = 300  # ... and answers without them once none has finished for this long (a search on another host died)
TPE_OPTIONS: dict = {}
# what a stored study's trial parameters mean: a new version starts new studies rather than resume old ones
# (2: DDP and ZeRO-1 with tp joined the space, under one "sharding" parameter; 3: the constraint is the chance of
# running out of memory, not the predicted peak over capacity)
SPACE_VERSION = 3


class SearchCancelled(RuntimeError):
    """The search was told to stop (its client went away, or the service is shutting down)."""


class SearchRefused(ValueError):
    """A search request that cannot be run as asked: the message says why and what to change."""


def space_of(request: SearchRequest) -> Space:
    w = request.workload
    # bfloat16 or FP8 where the GPUs have FP8 matmuls: the precision is part of the plan a user picks
    choices = request.cluster.float8_choices
    precisions = choices if len(choices) > 1 and w.dtype == "bfloat16" else ()
    cluster, mbs = request.cluster.cluster(), request.micro_batch_sizes
    return Space(w, cluster, micro_batch_sizes=mbs, precisions=precisions, framework=request.framework)


def exhaustive(request: SearchRequest, space: Space, should_stop=None) -> list[RunSpec] | None:
    """Every plan of the space, if the request asks for it or (auto) the space fits in the trial budget. A space
    larger than the budget is refused for sampler 'exhaustive' (SearchRefused, with its size): exhaustive means
    every plan of a space no larger than the trials asked for."""
    if request.sampler == "optuna":
        return None
    if space.count(limit=request.trials, should_stop=should_stop) > request.trials:
        if request.sampler == "exhaustive":
            size = space.count(should_stop=should_stop)
            raise SearchRefused(
                f"sampler 'exhaustive' evaluates every plan of the space, and this space holds {size:,} plans, over "
                f"the trial budget of {request.trials}: raise trials (at most {MAX_SEARCH_TRIALS:,}), narrow "
                "micro_batch_sizes, or use sampler 'auto' or 'optuna'"
            )
        return None
    return list(space.iter_plans(should_stop))


def study_name(request: SearchRequest, predictor: BatchPredictor) -> str:
    request_key = request.model_dump(mode="json", exclude={"trials", "top_k"})
    key = json.dumps([request_key, predictor.info.get("run_id"), SPACE_VERSION], sort_keys=True)
    return f"search-{request.objective}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def make_study(request: SearchRequest, name: str, storage: optuna.storages.BaseStorage | None) -> optuna.Study:
    """Infeasible plans are constraints (each trial sets its own, Trial.set_constraint), not dropped trials.
    ``storage``: opened by serve.search.storage.open_storage (None: in memory)."""
    directions = ["minimize"] if request.objective == "time" else ["minimize", "minimize"]
    return optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=_sampler(request, request.seed),
        directions=directions,
        load_if_exists=True,
    )


def _sampler(request: SearchRequest, seed: int | None) -> optuna.samplers.BaseSampler:
    if request.objective == "time":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=20, **TPE_OPTIONS)
    return optuna.samplers.NSGAIISampler(seed=seed, population_size=32)


def _draw_apart(request: SearchRequest, study: optuna.Study) -> None:
    """A search joining (or resuming) a study that holds trials draws from a seed of its own, still derived from the
    request's: that seed again would draw the plans the study's first search drew (three searches of one seed
    sharing 96 trials evaluated 53 distinct plans, where one search alone evaluated 73)."""
    n = len(study.get_trials(deepcopy=False))
    if n and request.seed is not None:
        study.sampler = _sampler(request, int(hashlib.sha256(f"{request.seed}:{n}".encode()).hexdigest()[:8], 16))


def run_search(
    predictor: BatchPredictor,
    request: SearchRequest,
    storage: str | None = None,
    name: str | None = None,
    progress: bool = False,
    space: Space | None = None,
    should_stop=None,
    on_progress=None,
) -> optuna.Study:
    """Run (or resume, or join) the study until it holds request.trials finished trials, or every plan of the space
    when exhaustive (over ``space`` if given), and until the trials other searches of it run are finished too.
    request.trials is the study's size, not this search's share: three searches asking 100 each end with 100
    between them (ask for more to add some). A search first gives back the trials a killed one left running, so
    each is evaluated; an exhaustive one evaluates each plan of the space exactly once, however many share it.
    ``on_progress(done, total)``: told after each round (the browser page's progress bar)."""
    space = space or space_of(request)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        plans = exhaustive(request, space, should_stop)
    except SpaceStopped as e:
        raise SearchCancelled(str(e)) from None
    # an exhaustive study and a sampled one of the same request are different studies
    name = name or study_name(request, predictor) + ("-all" if plans is not None else "")
    opened = stored.open_storage(storage)
    study = make_study(request, name, opened)
    with stored.exclusive(opened, name):
        stored.requeue_abandoned(study)
        if plans is not None:
            stored.enqueue_missing(study, plans, space)
    running, since, joined, done = None, time.monotonic(), False, 0
    total = _left(request, study, plans)
    with tqdm(total=total, desc="searching plans", unit="trial", disable=not progress) as bar:
        while True:
            if should_stop is not None and should_stop():
                raise SearchCancelled(f"search stopped with {_left(request, study, plans)} trials to go")
            with stored.exclusive(opened, name):  # counted and taken in one go: another search takes trials too
                stored.requeue_abandoned(study, own=False)
                if not joined:  # what the study holds when this search first asks: the count under the lock
                    _draw_apart(request, study)
                    joined = True
                batch = _take(request, study, plans is not None, shared=opened is not None)
            if batch:
                _evaluate(predictor, request, study, space, batch)
                bar.update(len(batch))
                done += len(batch)  # not bar.n: a disabled bar counts nothing
                if on_progress is not None:
                    on_progress(done, total)
                continue
            others = {t.number for t in study.get_trials(deepcopy=False, states=(stored.RUNNING,))}
            if others != running:
                running, since = others, time.monotonic()
            if not others or time.monotonic() - since > STALLED_S:
                return study
            time.sleep(POLL_S)


def _take(request: SearchRequest, study: optuna.Study, queued_only: bool, shared: bool) -> list[optuna.Trial]:
    """This round's trials: queued plans, or (sampled) as many as the study still lacks, counting those running."""
    if queued_only:
        return stored.claim_queued(study, BATCH if shared else EXHAUSTIVE_BATCH)
    n = min(BATCH, request.trials - stored.count(study, *stored.FINISHED, stored.RUNNING))
    return [stored.ask(study) for _ in range(n)]


def _left(request: SearchRequest, study: optuna.Study, plans) -> int:
    if plans is not None:
        return stored.count(study, stored.WAITING)
    return max(request.trials - stored.finished(study), 0)


def _evaluate(predictor: BatchPredictor, request: SearchRequest, study: optuna.Study, space: Space, batch) -> None:
    specs = [suggest(t, space) for t in batch]
    valid = [(t, s) for t, s in zip(batch, specs) if s is not None]
    for t, s in zip(batch, specs):
        if s is None:
            t.set_user_attr("invalid", "rejected by collect.schema.plan_problems")
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
    if not valid:
        return
    pred = predictor.predict([s for _, s in valid], request.cluster.hardware_name(), workers=0)
    for (t, s), row in zip(valid, pred.to_dict("records")):
        capacity = s.cluster.memory_bytes
        over = (row["peak_mem_bytes"] - capacity) / capacity
        # feasible when <= 0, what the samplers read: a plan may run out of memory no more often than asked
        t.set_constraint("oom_risk_over_max", row["oom_risk"] - request.max_oom_risk)
        t.set_user_attr("mem_over_capacity", over)
        t.set_user_attr("oom_risk", row["oom_risk"])
        t.set_user_attr("iter_time_s", row["iter_time_s"])
        t.set_user_attr("peak_mem_bytes", row["peak_mem_bytes"])
        values = [math.log(row["iter_time_s"])]
        if request.objective == "pareto":
            values.append(math.log(row["peak_mem_bytes"]))
        study.tell(t, values if len(values) > 1 else values[0])


def _results(
    predictor: BatchPredictor, request: SearchRequest, trials, space: Space, limit: int | None = None
) -> list[SearchResult]:
    """The distinct plans of ``trials`` (in order, at most ``limit``), re-predicted in full."""
    specs, seen = [], set()
    for t in trials:
        spec = suggest(optuna.trial.FixedTrial(t.params), space)
        key = spec.plan.model_dump_json() + str(spec.workload.micro_batch_size)
        if key not in seen:  # samplers revisit good plans: the top k are k different plans
            seen.add(key)
            specs.append(spec)
            if limit is not None and len(specs) == limit:
                break
    if not specs:
        return []
    columns = predictor.predict_columns(specs, request.cluster.hardware_name(), workers=0)
    return [
        SearchResult(plan=s.plan, micro_batch_size=s.workload.micro_batch_size, float8=s.workload.float8, prediction=p)
        for s, p in zip(specs, predictions(columns))
    ]


def search(
    predictor: BatchPredictor,
    request: SearchRequest,
    storage: str | None = None,
    progress: bool = False,
    space: Space | None = None,
    should_stop=None,
) -> SearchResponse:
    """Run the search and answer with the top plans (and the Pareto front); ``space`` narrows the default space."""
    space = space or space_of(request)
    study = run_search(predictor, request, storage, progress=progress, space=space, should_stop=should_stop)
    return answer(predictor, request, study, space, should_stop)


def answer(
    predictor: BatchPredictor, request: SearchRequest, study: optuna.Study, space: Space, should_stop=None
) -> SearchResponse:
    """A finished study as the search's response: its top plans, re-predicted in full, and its Pareto front."""
    feasible = sorted(feasible_trials(study), key=lambda t: t.user_attrs["iter_time_s"])
    best = _results(predictor, request, feasible, space, limit=request.top_k)
    pareto = []
    if request.objective == "pareto":
        feasible_ids = {t.number for t in feasible}
        front = [t for t in study.best_trials if t.number in feasible_ids]
        pareto = sorted(_results(predictor, request, front, space), key=lambda r: r.prediction.iter_time_s)
    finished = finished_trials(study)
    distinct = len({stored.key(t.params) for t in finished})
    try:
        space_size = space.count(should_stop=should_stop)
    except SpaceStopped as e:
        raise SearchCancelled(str(e)) from None
    # what was searched, said as it happened: exhaustive only when every plan of the space was evaluated
    fits = request.sampler != "optuna" and space_size <= request.trials
    sampler = "exhaustive" if fits and distinct == space_size else "optuna"
    return SearchResponse(
        model=model_summary(predictor),
        objective=request.objective,
        sampler=sampler,
        trials=len(finished),
        distinct_plans=distinct,
        feasible_trials=len(feasible),
        space_size=space_size,
        best=best,
        pareto=pareto,
        precisions=list(space.precisions),
        moe=request.workload.family == "moe",
    )
