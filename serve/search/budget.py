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

Before a search runs, its cost is estimated from the space without walking it (serve.search.space: the candidates
counted by arithmetic, a seeded sample of them priced): the plans it will evaluate (every plan of an exhaustive
space, else its trials) at the sample's mean price. A synchronous POST /search whose estimate is over SEARCH's
budget is refused with the estimate; a background search runs under JOB's budget and stops there with the best
plans so far. While a search runs, a Meter adds up what it has done at the same prices, and the search stops
before a step that would take it past its budget, or once its wall time is twice the budget (a machine much
busier than the prices allow for).

The constants are this machine's (2 cores), from experiments/bench/search_cost.py (a 5,000-trial TPE search and an
exhaustive one, run whole: experiments/results/search_cost.json) and experiments/bench/search_budget.py (the
service's searches at their budgets: search_budget.json), measured / estimated at most about 0.65 quiet.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gnn.inference.cost import BYTES_FIXED, CHUNK_BYTES, REQUEST_BYTES, REQUEST_SECONDS, SECONDS_FIXED

SECONDS_PER_CANDIDATE = 6e-6  # a candidate choice walked and checked (validity cached per pipeline shape)
SECONDS_PER_TRIAL = 2e-3  # ask, suggest, tell in an in-memory study (NSGA-II's own work, the exhaustive queue)
SECONDS_PER_TPE_SEEN = 3e-6  # TPE's ask, per finished trial and parameter of the space: it reads all of them
BYTES_PER_TRIAL = 24 * 2**10  # a trial kept in an in-memory study (params, attrs, constraints, distributions)
WALL_FACTOR = 2.0  # a search still running at this multiple of its budget in wall time stops, whatever it has spent
# a search predicts chunk after chunk, and the allocator keeps what one freed, fragmented, beside the next: the
# server's peak was 1.4 times its largest chunk alone (experiments/results/search_budget.json, issue-52)
CHUNKS_HELD = 1.5


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
    """A search's cost before it runs, and what it rests on."""

    seconds: float
    bytes: float
    plans: int  # plans it will evaluate (distinct)
    sampler: str  # tpe, nsga2 or exhaustive
    space_plans: int  # the space's plans, as estimated from the sample (exact when exhaustive)
    over_budget_plans: int  # plans of the space left out because /predict would refuse each alone (estimated)
    parts: dict = field(default_factory=dict)  # seconds per part: walk, sampler, plans, answer

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


def estimate_of(
    sampler: str,
    plans: int,
    mean_plan_seconds: float,
    largest_chunk_bytes: float,
    walked: int,
    answered: int,
    trials: int,
    space_plans: int,
    over_budget_plans: int,
    parameters: int,
) -> Estimate:
    """An Estimate from the figures the space gives (serve.search.space.Space.price)."""
    parts = {
        "walk": SECONDS_PER_CANDIDATE * walked,
        "sampler": sampler_seconds(sampler, 0, trials if sampler != "exhaustive" else plans, parameters),
        "plans": SECONDS_FIXED + mean_plan_seconds * plans,
        "answer": SECONDS_FIXED + mean_plan_seconds * answered,
    }
    memory = BYTES_FIXED + BYTES_PER_TRIAL * max(trials, plans) + CHUNKS_HELD * max(CHUNK_BYTES, largest_chunk_bytes)
    return Estimate(sum(parts.values()), memory, plans, sampler, space_plans, over_budget_plans, parts)


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

    def pay(self, seconds: float, what: str) -> None:
        """Charge ``seconds`` if affordable, else raise BudgetSpent naming ``what`` could not be paid for."""
        if not self.afford(seconds):
            raise BudgetSpent(
                f"{self.budget.name} stopped at its budget of {self.budget.seconds:.0f} s "
                f"({self.spent:.1f} s spent, {time.monotonic() - self.started:.1f} s wall) before {what}"
            )
        self.charge(seconds)
