"""What a plan search costs: estimated from its space before any of it runs, and metered as it runs.

A search pays for four things, each priced in the seconds of gnn.inference.cost (an upper bound on this machine's
quiet wall time, not a mean):
- walking its space: every candidate choice is checked for validity (about 4 us a candidate, more where a
  pipeline shape is new), to count the space and to list it for an exhaustive search;
- its sampler: TPE reads every finished trial on each ask, one Parzen estimator per parameter of the space (2 us
  per trial seen and parameter here, so a 5,000-trial search of 6 parameters spends ~130 s in TPE alone), NSGA-II
  and the exhaustive queue a millisecond or two per trial;
- evaluating its plans, each as POST /predict prices it; a plan evaluated again is answered from the search's
  own cache;
- re-predicting its top plans for the answer.

Before a search runs, its cost is estimated from the space without walking it (``estimate``: the candidates counted
by arithmetic, PRICE_SAMPLE of them drawn at random, checked and priced; a space of at most PRICE_WHOLE candidates
walked whole): the plans it will evaluate (every plan of an exhaustive space, else its trials) at the sample's mean
price. A synchronous POST /search whose estimate is over SEARCH's
budget is refused with the estimate; a background search runs under JOB's budget and stops there with the best
plans so far. While a search runs, a Meter adds up what it has done at the same prices, and the search stops
before a step that would take it past its budget, or once its wall time is twice the budget (a machine much
busier than the prices allow for).

The constants are this machine's (2 cores), from experiments/bench/search_budget.py (experiments/results/
search_budget.json: a 5,000-trial TPE search and an exhaustive one run whole, and the service's searches at their
budgets), measured / estimated at most about 0.65 quiet.
"""

from __future__ import annotations

import bisect
import random
import time
from dataclasses import dataclass, field

from collect.schema import RunSpec
from gnn.inference.cost import BYTES_FIXED, CHUNK_BYTES, REQUEST_BYTES, REQUEST_SECONDS, SECONDS_FIXED, plan_cost
from serve.schemas import SearchRequest
from serve.search.space import OVER_BUDGET, Space, space_of

SECONDS_PER_CANDIDATE = 6e-6  # a candidate choice walked and checked (validity cached per pipeline shape)
SECONDS_PER_TRIAL = 2e-3  # ask, suggest, tell in an in-memory study (NSGA-II's own work, the exhaustive queue)
# a trial's writes to an RDB study: a commit per parameter, user attribute and state, about 19. SQLite on this
# machine, an exhaustive search of 288 plans: 50-56 ms a trial against 2.5 in memory (2026-12-02); PostgreSQL is
# priced alike, not measured
SECONDS_PER_STORED_TRIAL = 0.055
SECONDS_PER_TPE_SEEN = 3e-6  # TPE's ask, per finished trial and parameter of the space: it reads all of them
BYTES_PER_TRIAL = 24 * 2**10  # a trial kept in an in-memory study (params, attrs, constraints, distributions)
WALL_FACTOR = 2.0  # a search still running at this multiple of its budget in wall time stops, whatever it has spent
# a search predicts chunk after chunk, and the allocator keeps what one freed, fragmented, beside the next: the
# server's peak was 1.4 times its largest chunk alone (experiments/results/search_budget.json, issue-52)
CHUNKS_HELD = 1.5
PRICE_WHOLE, PRICE_SAMPLE = 20_000, 2048  # a space walked whole to be priced (~0.2 s), else a sample of it (~0.1 s)
# a sampled search's answer counts its space exactly up to this many candidates (~1.5 s), else from the sample
EXACT_COUNT_CANDIDATES = 250_000
PARETO_PLANS = 32  # a pareto search's answer: its front, priced as this many plans beyond top_k


class SearchRefused(ValueError):
    """A search request that cannot be run as asked: the message says why and what to change; ``field`` is the
    request's field it concerns."""

    def __init__(self, message: str, field: str = "sampler"):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Budget:
    """What one search may cost: estimated seconds of work and bytes above the idle server."""

    seconds: float
    bytes: float
    name: str

    def study_bytes(self, trials: int) -> float:
        return BYTES_PER_TRIAL * trials

    def plan_bytes(self, trials: int) -> float:
        """The most a single plan's chunk may hold in a search of ``trials``: what the budget leaves beside the
        server's fixed share and the study, for CHUNKS_HELD chunks."""
        return (self.bytes - BYTES_FIXED - self.study_bytes(trials)) / CHUNKS_HELD


# a synchronous POST /search: one request, as /predict's budget
SEARCH = Budget(REQUEST_SECONDS, REQUEST_BYTES, "a synchronous search (POST /search)")
# a background search (POST /searches): minutes of work, the same memory
JOB = Budget(300.0, REQUEST_BYTES, "a background search (POST /searches)")


def sampler_seconds(sampler: str, done: int, n: int, parameters: int) -> float:
    """The sampler's own work to ask and tell trials done+1 .. done+n of a space of ``parameters`` (Space.parameters).
    ``sampler``: tpe, nsga2 or exhaustive."""
    seconds = SECONDS_PER_TRIAL * n
    if sampler == "tpe":  # the i-th ask reads i finished trials: sum over i of done .. done + n - 1
        seconds += SECONDS_PER_TPE_SEEN * parameters * (n * done + n * (n - 1) / 2)
    return seconds


@dataclass(frozen=True)
class Estimate:
    """A search's cost before it runs (``estimate``), and what it rests on."""

    seconds: float
    bytes: float
    plans: int  # plans it will evaluate (distinct)
    sampler: str  # tpe, nsga2 or exhaustive
    space_plans: int  # the space's plans, as estimated from the sample (exact when exhaustive)
    over_budget_plans: int  # plans of the space left out because /predict would refuse each alone (estimated)
    parts: dict = field(default_factory=dict)  # seconds per part: walk, sampler, plans, answer (storage: stored)

    def over(self, budget: Budget) -> str | None:
        """Why a search of this estimate cannot run within ``budget``, with the figures; None when it can."""
        if self.seconds > budget.seconds:
            parts = ", ".join(f"{k} {v:.1f} s" for k, v in self.parts.items())
            return (
                f"the search's estimated work is {self.seconds:,.1f} s ({self.plans:,} plans by {self.sampler}; "
                f"{parts}), over the budget of {budget.seconds:.0f} s of {budget.name}"
            )
        if self.bytes > budget.bytes:
            return (
                f"the search's estimated memory is {self.bytes / 2**20:,.0f} MiB, over the budget of "
                f"{budget.bytes / 2**20:,.0f} MiB of {budget.name}: ask for fewer trials"
            )
        return None

    def summary(self) -> dict:
        return {
            "seconds": round(self.seconds, 3),
            "bytes": int(self.bytes),
            "plans": self.plans,
            "sampler": self.sampler,
            "parts": {k: round(v, 3) for k, v in self.parts.items()},
        }


def checked(request: SearchRequest, budget: Budget, refuse_over_time: bool) -> tuple[Space, Estimate]:
    """The request's space and estimate, or SearchRefused (field trials) when the estimate is over ``budget``'s
    memory, or over its time when ``refuse_over_time`` (a synchronous search: a background one stops at its budget
    instead)."""
    space = space_of(request, budget.plan_bytes(request.trials))
    priced = estimate(request, space)
    if priced.bytes > budget.bytes or (refuse_over_time and priced.seconds > budget.seconds):
        advice = ": ask for fewer trials, narrow micro_batch_sizes, or search in the background (POST /searches), "
        advice += "which stops at its own budget with the best plans so far"
        raise SearchRefused(f"{priced.over(budget)}{advice if refuse_over_time else ''}", field="trials")
    return space, priced


def estimate(request: SearchRequest, space: Space, stored: bool = False) -> Estimate:
    """What a search of ``space`` will cost, from the count of its candidates and a sample of them (``sampled``):
    the share that are plans, the share left out for their cost, and the mean price of a plan; ``stored``: its
    trials are written to an RDB study (the shell's), not kept in memory (the service's). No plan is predicted:
    0.02-0.25 s, the largest spaces the limits allow included."""
    candidates, (specs, _, sampled_n) = space.candidates(), sampled(space)
    space_plans, over = estimated_size(space)
    costs = [plan_cost(s.plan) for s in specs]
    mean = sum(c.seconds - SECONDS_FIXED for c in costs) / len(costs) if costs else 0.0
    largest = max((c.single_chunk_bytes for c in costs), default=0.0)
    exhaustive = request.sampler == "exhaustive" or (request.sampler == "auto" and space_plans <= request.trials)
    plans = space_plans if exhaustive else min(request.trials, space_plans)
    # walked: a space of at most EXACT_COUNT_CANDIDATES is counted whole (for the answer), and listed again when
    # exhaustive; a larger one until trials + 1 plans are seen, to know it is larger than the trials
    if candidates <= EXACT_COUNT_CANDIDATES or exhaustive:
        walked = candidates * (2 if exhaustive else 1)
    else:
        walked = min(candidates, (request.trials + 1) * sampled_n / max(len(specs), 1))
    kind = "exhaustive" if exhaustive else ("tpe" if request.objective == "time" else "nsga2")
    answered = request.top_k + (PARETO_PLANS if request.objective == "pareto" else 0)
    parts = {
        "walk": SECONDS_PER_CANDIDATE * walked,
        "sampler": sampler_seconds(kind, 0, plans if exhaustive else request.trials, parameters(space)),
        "plans": SECONDS_FIXED + mean * plans,
        "answer": SECONDS_FIXED + mean * answered,
    }
    if stored:
        parts["storage"] = SECONDS_PER_STORED_TRIAL * (plans if exhaustive else request.trials)
    trials = max(request.trials, plans)
    memory = BYTES_FIXED + BYTES_PER_TRIAL * trials + CHUNKS_HELD * max(CHUNK_BYTES, largest)
    return Estimate(sum(parts.values()), memory, plans, kind, space_plans, over, parts)


def sampled(space: Space) -> tuple[list[RunSpec], int, int]:
    """The plans among a sample of the space's candidates, how many of it are left out for their cost, and its
    size: PRICE_SAMPLE drawn at random (seeded), or every candidate of a space of at most PRICE_WHOLE, which is
    then counted (Space.count keeps it). Kept with the space."""
    if "sampled" not in space.memo:
        if space.candidates() <= PRICE_WHOLE:
            space.count()
            space.memo["sampled"] = (space.enumerate(), space.over_budget_plans, space.candidates())
        else:
            states = [(c, space.state(c)) for c in sample(space, PRICE_SAMPLE)]
            specs = [space.spec(*c) for c, state in states if state is True]
            space.memo["sampled"] = (specs, sum(state == OVER_BUDGET for _, state in states), len(states))
    return space.memo["sampled"]


def estimated_size(space: Space) -> tuple[int, int]:
    """(plans, plans left out for their cost) as ``sampled`` has them: exact where it walked the space whole."""
    specs, over, sampled_n = sampled(space)
    share = space.candidates() / max(sampled_n, 1)
    return round(len(specs) * share), round(over * share)


def sample(space: Space, k: int, seed: int = 0) -> list[tuple]:
    """``k`` candidates of the space drawn uniformly (with replacement), seeded, without walking it."""
    rng, out = random.Random(seed), []
    for _ in range(k):
        i = rng.randrange(space.candidates())
        g = bisect.bisect_right(space.sizes, i)
        layout, mbs, sharding, recompute = space.groups[g]
        i -= space.sizes[g - 1] if g else 0
        picked = []
        for options in reversed(space.inner(layout, sharding)):  # mixed radix, the last varying fastest
            i, j = divmod(i, len(options))
            picked.append(options[j])
        (schedule, virtual), sp, (etp, ep), (f8, gather) = reversed(picked)
        out.append((layout, mbs, sharding, recompute, schedule, virtual, sp, ep, f8, gather, etp))
    return out


def parameters(space: Space) -> int:
    """How many parameters a sampler draws a plan of the space by (serve.search.trials.suggest): layout, micro-batch
    size, sharding and recompute, and each of schedule, sequence parallel, ep, etp and precision some layout offers."""
    layouts = space.layouts()
    optional = (
        any(pp > 1 for pp, _, _, _ in layouts),
        any(tp > 1 for _, _, _, tp in layouts),
        len(space.expert_degrees) > 1,
        any(len(space.expert_tps(tp)) > 1 for _, _, _, tp in layouts),
        bool(space.precisions),
        "tensorwise" in space.precisions,  # its FP8 all-gather, under FSDP
    )
    return 4 + sum(optional)


class BudgetSpent(RuntimeError):
    """A search reached its budget: it answers with what it has evaluated, marked stopped by the budget."""


class Meter:
    """A running search's spending, at the estimate's prices, against its budget (None: unbounded, as the CLI's
    searches on a user's own machine are)."""

    def __init__(self, budget: Budget | None):
        self.budget, self.spent, self.started = budget, 0.0, time.monotonic()
        self.stopped: str | None = None  # why the search stopped at its budget (set by serve.search.study)

    def afford(self, seconds: float) -> bool:
        """Whether ``seconds`` more stays within the budget (in price, and in wall time)."""
        if self.budget is None:
            return True
        wall = time.monotonic() - self.started
        return self.spent + seconds <= self.budget.seconds and wall <= WALL_FACTOR * self.budget.seconds

    def charge(self, seconds: float) -> None:
        self.spent += seconds

    def walk(self, candidates: int) -> None:
        """Pay for walking ``candidates`` of the space (Space._walk)."""
        self.pay(SECONDS_PER_CANDIDATE * candidates, "walking the rest of the plan space")

    def pay(self, seconds: float, what: str) -> None:
        """Charge ``seconds`` if affordable, else raise BudgetSpent naming ``what`` could not be paid for."""
        if not self.afford(seconds):
            raise BudgetSpent(
                f"{self.budget.name} stopped at its budget of {self.budget.seconds:.0f} s "
                f"({self.spent:.1f} s spent, {time.monotonic() - self.started:.1f} s wall) before {what}"
            )
        self.charge(seconds)
