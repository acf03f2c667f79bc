"""Searches that run in the background, for the browser page: POST /searches starts one and answers with its id at
once, GET /searches/{id} says how far it is (trials done of the budget) and, once done, gives the same JSON
POST /search answers plus every evaluated plan's time and memory (the page's scatter), DELETE cancels it.

A job runs under a budget of its own (serve.search.budget.JOB: minutes of estimated work, the memory of a request)
and stops there with the best plans so far, its response marked ``stopped_by: "budget"``. Jobs run in the
service's heavy slots, beside synchronous searches and /explain, in arrival order; the rest wait their turn
("queued"), up to MAX_KEPT jobs unfinished (more get 503); the service keeps the last MAX_KEPT jobs' answers,
forgetting older finished ones. A DELETE, or SIGTERM, stops a job inside its current batch (gnn.cancel).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field

from collect.hardware.records import UnknownHardware
from gnn import cancel
from gnn.inference.predictor import BatchPredictor
from serve.inflight import Inflight, Unavailable
from serve.schemas import SearchRequest
from serve.search.budget import JOB, Budget, Estimate, Meter, SearchRefused
from serve.search.evaluate import Evaluated, answer
from serve.search.space import Space
from serve.search.storage import finished_trials
from serve.search.study import run_search

MAX_KEPT = 32  # jobs remembered, finished or not; as many unfinished ones are the most that may wait
log = logging.getLogger("plansight.serve")


@dataclass(eq=False)  # hashed by identity: the service counts running searches in a set
class Job:
    id: str
    request: SearchRequest
    space: Space
    estimate: Estimate
    total: int
    done: int = 0
    state: str = "queued"  # queued, running, done, failed, cancelled
    response: str | None = None  # the SearchResponse's JSON, as POST /search answers it
    points: list[dict] = field(default_factory=list)
    error: list[dict] | None = None  # the 422 detail format: field and message
    stop: threading.Event = field(default_factory=threading.Event)
    budget: Budget = JOB
    started: float = field(default_factory=time.monotonic)
    seconds: float | None = None

    def status(self) -> dict:
        """What GET /searches/{id} answers (the response itself is spliced in by the route, unparsed)."""
        return {
            "id": self.id,
            "state": self.state,
            "done": self.done,
            "total": self.total,
            "seconds": self.seconds if self.seconds is not None else time.monotonic() - self.started,
            "error": self.error,
            "estimate": self.estimate.summary(),
            "budget": {"seconds": self.budget.seconds, "bytes": int(self.budget.bytes)},
            "points": self.points if self.state == "done" else [],
        }


class Jobs:
    def __init__(self, predictor: BatchPredictor, inflight: Inflight, budget: Budget = JOB):
        self.predictor, self.inflight, self.budget = predictor, inflight, budget
        self.jobs: dict[str, Job] = {}
        self.lock = threading.Lock()
        self.slots = inflight.heavy

    def start(self, request: SearchRequest, space: Space, estimate: Estimate) -> Job:
        """A job for a request checked against JOB's budget (serve.search.study.checked), queued for a heavy slot."""
        with self.lock:
            if self.inflight.stopping.is_set():
                raise Unavailable("the service is shutting down")
            if sum(j.state in ("queued", "running") for j in self.jobs.values()) >= MAX_KEPT:
                raise Unavailable(f"the service is busy: {MAX_KEPT} searches are queued or running; retry later")
            ticket = self.slots.join()  # its place in line, now: Unavailable when the queue is full
            total = min(request.trials, estimate.plans)
            job = Job(secrets.token_hex(8), request, space, estimate, total, budget=self.budget)
            self._forget_old()
            self.jobs[job.id] = job
            self.inflight.running.add(job.stop)  # SIGTERM stops it as it stops requests
        threading.Thread(target=self._run, args=(job, ticket), name=f"search-{job.id}", daemon=True).start()
        return job

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def cancel(self, job_id: str) -> Job | None:
        job = self.jobs.get(job_id)
        if job is not None:
            job.stop.set()
        return job

    def _forget_old(self) -> None:
        finished = [j for j in self.jobs.values() if j.state not in ("queued", "running")]
        for job in finished[: max(len(self.jobs) + 1 - MAX_KEPT, 0)]:
            del self.jobs[job.id]

    def _run(self, job: Job, ticket: object) -> None:
        def progress(done: int, total: int) -> None:
            job.done, job.total = done, total

        if not self.slots.wait(ticket, job.stop.is_set):  # queued: waits for a slot, or for a cancel
            job.state, job.seconds = "cancelled", time.monotonic() - job.started
            self.inflight.running.discard(job.stop)
            return
        job.state = "running"
        try:
            with self.inflight.searching(job), cancel.stop_when(job.stop.is_set):
                meter, found = Meter(self.budget), Evaluated()
                study = run_search(
                    self.predictor, job.request, space=job.space, on_progress=progress, meter=meter, evaluated=found
                )
                response = answer(self.predictor, job.request, study, job.space, meter, found, job.estimate)
                job.points = evaluated(study, job.request.max_oom_risk)
                job.response, job.state = response.model_dump_json(), "done"
        except cancel.Cancelled:
            job.state = "cancelled"
        except (SearchRefused, UnknownHardware) as e:
            where = "cluster" if isinstance(e, UnknownHardware) else e.field
            job.error, job.state = [{"loc": ["body", where], "msg": str(e), "type": type(e).__name__}], "failed"
        except Exception as e:  # noqa: BLE001 - a job's thread has no caller to raise to: logged, and said
            log.exception("search %s failed", job.id)
            job.error = [{"loc": [], "msg": f"internal error: {type(e).__name__}", "type": "internal"}]
            job.state = "failed"
        finally:
            job.seconds = time.monotonic() - job.started
            self.inflight.running.discard(job.stop)
            self.slots.release()


def evaluated(study, max_oom_risk: float) -> list[dict]:
    """Every evaluated trial's predicted time and peak memory, and whether the search could pick it."""
    return [
        {
            "trial": t.number,
            "iter_time_s": t.user_attrs["iter_time_s"],
            "peak_mem_bytes": t.user_attrs["peak_mem_bytes"],
            "oom_risk": t.user_attrs["oom_risk"],
            "feasible": t.user_attrs["oom_risk"] <= max_oom_risk,
        }
        for t in finished_trials(study)
        if "iter_time_s" in t.user_attrs
    ]
