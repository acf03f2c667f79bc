"""A search's trials evaluated through the surrogate, and a finished (or stopped) study as the search's answer.

Each plan is predicted once per search: a plan the sampler draws again, and the answer's top plans, come from the
search's own cache (``Evaluated``). A round's new plans are predicted in chunks, each paid for on the search's
meter before it runs (serve.search.budget), so a search stops at its budget to within a chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

import optuna

from collect.schema import RunSpec
from gnn.inference.cost import SECONDS_FIXED, request_cost
from gnn.inference.predictor import BatchPredictor
from gnn.inference.probe import Z_UPPER
from serve.api import model_summary, predictions
from serve.schemas import PlanPrediction, SearchRequest, SearchResponse, SearchResult
from serve.search import storage as stored
from serve.search.budget import Estimate, Meter, estimated_size
from serve.search.space import Space
from serve.search.storage import feasible_trials, finished_trials
from serve.search.trials import suggest


@dataclass
class Evaluated:
    """What a search has predicted, by trial parameters (serve.search.storage.key): the plan and its prediction,
    so a plan sampled again, and the answer's top plans, cost nothing more."""

    plans: dict[str, tuple[RunSpec, PlanPrediction]] = field(default_factory=dict)


CHUNK_SECONDS = 1.0  # a chunk's estimated work, predicted at once and paid for before


def time_at(p: PlanPrediction, quantile: float) -> float:
    """A plan's time at ``quantile`` of its prediction: log-normal about the point, each side's spread read from its
    80% interval's end on that side (the 10th or 90th percentile)."""
    z = NormalDist().inv_cdf(quantile)
    end = p.iter_time_interval_s[1] if z >= 0 else p.iter_time_interval_s[0]
    return p.iter_time_s * (end / p.iter_time_s) ** (abs(z) / Z_UPPER)


def evaluate(
    predictor: BatchPredictor,
    request: SearchRequest,
    study: optuna.Study,
    space: Space,
    batch,
    meter: Meter,
    evaluated: Evaluated,
) -> None:
    todo = []
    for t in batch:
        spec = suggest(t, space)
        if spec is None:
            study.tell(t, state=optuna.trial.TrialState.PRUNED)  # suggest() said why, in the trial's "invalid"
            continue
        known = evaluated.plans.get(stored.key(t.params))
        if known is not None:
            _tell(study, request, t, known[1])
        else:
            todo.append((t, spec))
    for chunk in _chunks(todo):
        specs = [s for _, s in chunk]
        # a request's fixed share (new hardware, new pipeline shapes) is paid once per search, by run_search
        seconds = request_cost([s.plan for s in specs]).seconds - SECONDS_FIXED
        meter.pay(seconds, f"predicting {len(todo)} more plans")
        columns = predictor.predict_columns(specs, request.cluster.hardware_name(), workers=0)
        for (t, spec), prediction in zip(chunk, predictions(columns)):
            evaluated.plans[stored.key(t.params)] = (spec, prediction)
            _tell(study, request, t, prediction)


def _chunks(todo: list) -> list[list]:
    """``todo`` in order, cut where a chunk's estimated work would pass CHUNK_SECONDS (a single plan may)."""
    chunks, current, seconds = [], [], 0.0
    for item in todo:
        step = request_cost([item[1].plan]).seconds
        if current and seconds + step > CHUNK_SECONDS:
            chunks.append(current)
            current, seconds = [], 0.0
        current.append(item)
        seconds += step
    return chunks + ([current] if current else [])


def _tell(study: optuna.Study, request: SearchRequest, t, p: PlanPrediction) -> None:
    capacity = request.cluster.cluster().memory_bytes
    t.set_user_attr("mem_over_capacity", (p.peak_mem_bytes - capacity) / capacity)
    # feasible when <= 0, what the samplers read: a plan may run out of memory no more often than asked
    t.set_constraint("oom_risk_over_max", p.oom_risk - request.max_oom_risk)
    t.set_user_attr("oom_risk", p.oom_risk)
    t.set_user_attr("iter_time_s", p.iter_time_s)
    t.set_user_attr("ranked_time_s", ranked := time_at(p, request.time_quantile))
    t.set_user_attr("peak_mem_bytes", p.peak_mem_bytes)
    values = [math.log(ranked)]
    if request.objective == "pareto":
        values.append(math.log(p.peak_mem_bytes))
    study.tell(t, values if len(values) > 1 else values[0])


def results(
    predictor: BatchPredictor,
    request: SearchRequest,
    trials,
    space: Space,
    evaluated: Evaluated,
    limit: int | None = None,
) -> list[SearchResult]:
    """The distinct plans of ``trials`` (in order, at most ``limit``), each with its full prediction: the search's
    own where it made one, else predicted now (trials another search of a shared study evaluated)."""
    picked, seen = [], set()
    for t in trials:
        spec, prediction = evaluated.plans.get(stored.key(t.params)) or (
            suggest(optuna.trial.FixedTrial(t.params), space),
            None,
        )
        key = spec.plan.model_dump_json() + str(spec.workload.micro_batch_size)
        if key not in seen:  # samplers revisit good plans: the top k are k different plans
            seen.add(key)
            picked.append((spec, prediction))
            if limit is not None and len(picked) == limit:
                break
    missing = [s for s, p in picked if p is None]
    if missing:
        predicted = iter(predictions(predictor.predict_columns(missing, request.cluster.hardware_name(), workers=0)))
        picked = [(s, p if p is not None else next(predicted)) for s, p in picked]
    return [
        SearchResult(
            plan=s.plan,
            micro_batch_size=s.workload.micro_batch_size,
            float8=s.workload.float8,
            prediction=p,
            ranked_time_s=time_at(p, request.time_quantile),
        )
        for s, p in picked
    ]


def answer(
    predictor: BatchPredictor,
    request: SearchRequest,
    study: optuna.Study,
    space: Space,
    meter: Meter | None = None,
    evaluated: Evaluated | None = None,
    estimated: Estimate | None = None,
) -> SearchResponse:
    """A finished (or stopped) study as the search's response: its top plans and its Pareto front."""
    evaluated = evaluated if evaluated is not None else Evaluated()
    feasible = sorted(feasible_trials(study), key=lambda t: t.user_attrs["ranked_time_s"])
    best = results(predictor, request, feasible, space, evaluated, limit=request.top_k)
    pareto = []
    if request.objective == "pareto":
        feasible_ids = {t.number for t in feasible}
        front = [t for t in study.best_trials if t.number in feasible_ids]
        pareto = sorted(results(predictor, request, front, space, evaluated), key=lambda r: r.prediction.iter_time_s)
    finished = finished_trials(study)
    distinct = len({stored.key(t.params) for t in finished})
    counted = space.over_budget_plans is not None  # counted whole (Space.count), else estimated from a sample
    size, over = (space.count(), space.over_budget_plans) if counted else estimated_size(space)
    # what was searched, said as it happened: exhaustive only when every plan of the space was evaluated
    fits = counted and request.sampler != "optuna" and size <= request.trials
    sampler = "exhaustive" if fits and distinct == size else "optuna"
    stopped = meter.stopped if meter is not None else None
    return SearchResponse(
        model=model_summary(predictor),
        objective=request.objective,
        sampler=sampler,
        trials=len(finished),
        distinct_plans=distinct,
        feasible_trials=len(feasible),
        space_size=size,
        space_size_exact=counted,
        over_budget_plans=over,
        best=best,
        pareto=pareto,
        precisions=list(space.precisions),
        moe=request.workload.family == "moe",
        stopped_by="budget" if stopped else None,
        stop_reason=stopped,
        estimate=estimated.summary() if estimated is not None else None,
    )
