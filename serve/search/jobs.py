"""Searches that run in the background, for the browser page: POST /searches starts one and answers with its id at
once, GET /searches/{id} says how far it is (trials done of the budget) and, once done, gives the same JSON
POST /search answers plus every evaluated plan's time and memory (the page's scatter), DELETE cancels it.

A job's work is bounded as a /search request's is (serve.schemas); MAX_RUNNING run at once and the rest wait
their turn ("queued"), up to MAX_KEPT jobs unfinished (more get 503); the service keeps the last MAX_KEPT jobs'
answers, forgetting older finished ones.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field

from collect.hardware.records import UnknownHardware
from gnn.inference.predictor import BatchPredictor, PredictionCancelled
from serve.inflight import Inflight, Unavailable
from serve.schemas import SearchRequest
from serve.search.space import SpaceStopped
from serve.search.storage import finished_trials
from serve.search.study import SearchCancelled, SearchRefused, answer, run_search, space_of

MAX_RUNNING = 2  # searches at once: the machine's cores
MAX_KEPT = 32  # jobs remembered, finished or not; as many unfinished ones are the most that may wait
POLL_S = 0.25  # a queued job looks this often whether it was cancelled
log = logging.getLogger("plansight.serve")


@dataclass(eq=False)  # hashed by identity: the service counts running searches in a set
class Job:
    id: str
    request: SearchRequest
    total: int
    done: int = 0
    state: str = "queued"  # queued, running, done, failed, cancelled
    response: str | None = None  # the SearchResponse's JSON, as POST /search answers it
    points: list[dict] = field(default_factory=list)
    error: list[dict] | None = None  # the 422 detail format: field and message
    stop: threading.Event = field(default_factory=threading.Event)
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
            "points": self.points if self.state == "done" else [],
        }


class Jobs:
    def __init__(self, predictor: BatchPredictor, inflight: Inflight):
        self.predictor, self.inflight = predictor, inflight
        self.jobs: dict[str, Job] = {}
        self.lock = threading.Lock()
        self.slots = threading.Semaphore(MAX_RUNNING)

    def start(self, request: SearchRequest) -> Job:
        with self.lock:
            if self.inflight.stopping.is_set():
                raise Unavailable("the service is shutting down")
            if sum(j.state in ("queued", "running") for j in self.jobs.values()) >= MAX_KEPT:
                raise Unavailable(f"the service is busy: {MAX_KEPT} searches are queued or running; retry later")
            job = Job(secrets.token_hex(8), request, total=request.trials)
            self._forget_old()
            self.jobs[job.id] = job
            self.inflight.running.add(job.stop)  # SIGTERM stops it as it stops requests
        threading.Thread(target=self._run, args=(job,), name=f"search-{job.id}", daemon=True).start()
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

    def _run(self, job: Job) -> None:
        def progress(done: int, total: int) -> None:
            job.done, job.total = done, total

        while not self.slots.acquire(timeout=POLL_S):  # queued: waits for a slot, or for a cancel
            if job.stop.is_set():
                job.state, job.seconds = "cancelled", time.monotonic() - job.started
                self.inflight.running.discard(job.stop)
                return
        job.state = "running"
        try:
            with self.inflight.searching(job):
                space = space_of(job.request)
                study = run_search(
                    self.predictor, job.request, space=space, should_stop=job.stop.is_set, on_progress=progress
                )
                response = answer(self.predictor, job.request, study, space, job.stop.is_set)
                job.points = evaluated(study, job.request.max_oom_risk)
                job.response, job.state = response.model_dump_json(), "done"
        except (SearchCancelled, PredictionCancelled, SpaceStopped):
            job.state = "cancelled"
        except (SearchRefused, UnknownHardware) as e:
            where = "cluster" if isinstance(e, UnknownHardware) else "sampler"
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
