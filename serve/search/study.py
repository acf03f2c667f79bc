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

What a search will cost is estimated before it runs, and metered as it runs (serve.search.budget): the service
refuses a synchronous search estimated over its budget, and stops any search at its budget, answering with the
best plans it has evaluated, marked ``stopped_by: "budget"``. Plans evaluated again (samplers revisit good ones)
are answered from the search's own cache, and so is its answer. A stop (a client gone, a cancel, SIGTERM: gnn.cancel)
lands inside a batch, even inside one large plan.
"""

from __future__ import annotations

import hashlib
import json
import time

import optuna
from tqdm import tqdm

from collect import REPO
from collect.schema import RunSpec
from gnn import cancel
from gnn.inference.cost import SECONDS_FIXED
from gnn.inference.predictor import BatchPredictor
from serve.schemas import MAX_SEARCH_TRIALS, SearchRequest, SearchResponse
from serve.search import storage as stored
from serve.search.budget import (
    EXACT_COUNT_CANDIDATES,
    BudgetSpent,
    Estimate,
    Meter,
    SearchRefused,
    parameters,
    sampler_seconds,
)
from serve.search.evaluate import Evaluated, answer, evaluate
from serve.search.space import Space, space_of

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


def exhaustive(request: SearchRequest, space: Space, meter: Meter | None = None) -> list[RunSpec] | None:
    """Every plan of the space, if the request asks for it or (auto) the space fits in the trial budget. A space
    larger than the budget is refused for sampler 'exhaustive' (SearchRefused, with its size): exhaustive means
    every plan of a space no larger than the trials asked for. A space small enough is counted whole here, for the
    answer (Space.count keeps it)."""
    if space.candidates() <= EXACT_COUNT_CANDIDATES:
        space.count(meter=meter)
    if request.sampler == "optuna":
        return None
    if space.count(limit=request.trials, meter=meter) > request.trials:
        if request.sampler == "exhaustive":
            size = space.count() if space.over_budget_plans is not None else None
            holds = f"{size:,} plans" if size is not None else f"more than {request.trials:,} plans"
            raise SearchRefused(
                f"sampler 'exhaustive' evaluates every plan of the space, and this space holds {holds}, over "
                f"the trial budget of {request.trials}: raise trials (at most {MAX_SEARCH_TRIALS:,}), narrow "
                "micro_batch_sizes, or use sampler 'auto' or 'optuna'"
            )
        return None
    return list(space.iter_plans(meter))


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
    on_progress=None,
    meter: Meter | None = None,
    evaluated: Evaluated | None = None,
) -> optuna.Study:
    """Run (or resume, or join) the study until it holds request.trials finished trials, or every plan of the space
    when exhaustive (over ``space`` if given), and until the trials other searches of it run are finished too.
    request.trials is the study's size, not this search's share: three searches asking 100 each end with 100
    between them (ask for more to add some). A search first gives back the trials a killed one left running, so
    each is evaluated; an exhaustive one evaluates each plan of the space exactly once, however many share it.
    ``on_progress(done, total)``: told after each round (the browser page's progress bar). ``meter``: the search
    stops before a step it cannot pay for, with ``meter.stopped`` saying so (its unevaluated trials failed, so
    the study holds only what was evaluated). ``evaluated``: the search's predictions, kept for its answer."""
    space = space or space_of(request)
    meter = meter or Meter(None)
    evaluated = evaluated if evaluated is not None else Evaluated()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        plans = exhaustive(request, space, meter)
    except BudgetSpent as e:
        meter.stopped = str(e)
        plans = []  # nothing to evaluate: the answer says the search stopped before its first plan
    # an exhaustive study and a sampled one of the same request are different studies
    name = name or study_name(request, predictor) + ("-all" if plans is not None else "")
    opened = stored.open_storage(storage)
    study = make_study(request, name, opened)
    with stored.exclusive(opened, name):
        stored.requeue_abandoned(study)
        if plans:
            stored.enqueue_missing(study, plans, space)
    if meter.stopped:
        return study
    sampler = "exhaustive" if plans is not None else ("tpe" if request.objective == "time" else "nsga2")
    try:
        meter.pay(SECONDS_FIXED, "its first prediction")
    except BudgetSpent as e:
        meter.stopped = str(e)
        return study
    running, since, joined, done = None, time.monotonic(), False, 0
    total = _left(request, study, plans)
    with tqdm(total=total, desc="searching plans", unit="trial", disable=not progress) as bar:
        while True:
            cancel.check(f"the search, with {_left(request, study, plans)} trials to go,")
            batch = []
            try:
                with stored.exclusive(opened, name):  # counted and taken in one go: another search takes trials too
                    stored.requeue_abandoned(study, own=False)
                    if not joined:  # what the study holds when this search first asks: the count under the lock
                        _draw_apart(request, study)
                        joined = True
                    batch = _take(request, study, space, plans is not None, opened is not None, meter, sampler)
                if batch:
                    evaluate(predictor, request, study, space, batch, meter, evaluated)
            except BudgetSpent as e:
                meter.stopped = str(e)
                for t in batch:  # what was asked and not evaluated is not part of the answer
                    study.tell(t, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
                return study
            if batch:
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


def _take(
    request: SearchRequest,
    study: optuna.Study,
    space: Space,
    queued_only: bool,
    shared: bool,
    meter: Meter,
    sampler: str,
) -> list[optuna.Trial]:
    """This round's trials: queued plans, or (sampled) as many as the study still lacks, counting those running;
    the sampler's work for them paid on ``meter`` first."""
    if queued_only:
        n = min(BATCH if shared else EXHAUSTIVE_BATCH, stored.count(study, stored.WAITING))
    else:
        n = min(BATCH, request.trials - stored.count(study, *stored.FINISHED, stored.RUNNING))
    if n <= 0:
        return []
    seconds = sampler_seconds(sampler, stored.finished(study), n, parameters(space))
    meter.pay(seconds, f"asking the sampler for {n} more plans")
    if queued_only:
        return stored.claim_queued(study, n)
    trials = []
    for _ in range(n):
        cancel.check("asking the sampler for plans")  # TPE's ask reads every finished trial: ~0.1 s at 5,000
        trials.append(stored.ask(study))
    return trials


def _left(request: SearchRequest, study: optuna.Study, plans) -> int:
    if plans is not None:
        return stored.count(study, stored.WAITING)
    return max(request.trials - stored.finished(study), 0)


def search(
    predictor: BatchPredictor,
    request: SearchRequest,
    storage: str | None = None,
    progress: bool = False,
    space: Space | None = None,
    meter: Meter | None = None,
    estimated: Estimate | None = None,
) -> SearchResponse:
    """Run the search and answer with the top plans (and the Pareto front); ``space`` narrows the default space,
    ``meter`` bounds it (serve.search.budget), ``estimated`` is what it was estimated to cost (said in the answer)."""
    space = space or space_of(request)
    meter, evaluated = meter or Meter(None), Evaluated()
    study = run_search(predictor, request, storage, progress=progress, space=space, meter=meter, evaluated=evaluated)
    return answer(predictor, request, study, space, meter, evaluated, estimated)
