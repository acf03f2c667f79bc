"""The service's requests as work off the event loop: parsed, validated and answered on worker threads, a few at
a time, each watched from the loop so that it stops when its client hangs up or the service shuts down.

Validating a request is work too (a plan's checks, an hf_config's arithmetic, a search's estimate): FastAPI would
run it on the event loop, where one slow body stalled /health for everyone, so the endpoints take the raw body
(read by serve.guard, with no slot) and hand it here.

Work runs in two pools of slots, each taken in arrival order: ``light`` for /predict and for reading what every
other route asks (validation and a search's estimate: at most a second), ``heavy`` for searches (synchronous and
background) and /explain. Two searches at the trial limit fill the heavy pool for minutes and leave /predict
answering at once. Nobody waits for ever: a request still waiting after WAIT_S gets 503 with Retry-After, and
one whose client hangs up while it waits leaves the queue. The work itself runs under gnn.cancel's stop flag, set
when the client hangs up or the service stops, which the work notices inside its loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import deque
from collections.abc import Callable

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from pydantic.json_schema import models_json_schema

from gnn import cancel

LIGHT_SLOTS = 2  # /predict and validation at once: the machine's cores (each request is bounded by serve.schemas)
HEAVY_SLOTS = 2  # searches and /explain at once (each bounded by serve.search.budget): their memory adds up
MAX_WAITING = 32  # requests waiting for a slot of one pool; past that the service answers 503 at once
WAIT_S = 10.0  # the longest a request waits for a slot before 503: a client is told to come back, not left hanging
POLL_S = 0.25  # how often a request waiting or in flight is checked for its client and for shutdown
HANDOFF_S = 0.02  # how often a request waiting at the head of its queue looks for a free slot
RETRY_AFTER_S = 5


class Unavailable(Exception):
    """503 with Retry-After: the service is shutting down, or too busy to take the request now."""


class Slots:
    """A pool of ``size`` work slots taken in arrival order, by requests on the event loop (which poll: ``take``)
    and by threads (which block: ``wait``). Thread-safe."""

    def __init__(self, name: str, size: int, max_waiting: int = MAX_WAITING):
        self.name, self.size, self.max_waiting = name, size, max_waiting
        self._free, self._queue, self._cond = size, deque(), threading.Condition()

    def join(self) -> object:
        """A place at the back of the queue (Unavailable when MAX_WAITING are waiting already)."""
        with self._cond:
            if len(self._queue) >= self.max_waiting:
                raise Unavailable(f"the service is busy: {len(self._queue)} requests wait for its {self.name} slots")
            ticket = object()
            self._queue.append(ticket)
            return ticket

    def take(self, ticket: object) -> bool:
        """Take a slot for ``ticket`` if it is first in line and one is free."""
        with self._cond:
            if self._free and self._queue and self._queue[0] is ticket:
                self._queue.popleft()
                self._free -= 1
                self._cond.notify_all()  # the next in line may be a thread
                return True
            return False

    def wait(self, ticket: object, give_up: Callable[[], bool]) -> bool:
        """Block until ``ticket`` takes a slot (True), or ``give_up()`` (False, out of the queue)."""
        while not self.take(ticket):
            if give_up():
                self.leave(ticket)
                return False
            with self._cond:
                self._cond.wait(POLL_S)
        return True

    def leave(self, ticket: object) -> None:
        with self._cond:
            with contextlib.suppress(ValueError):
                self._queue.remove(ticket)
            self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self._free += 1
            self._cond.notify_all()

    def status(self) -> dict:
        with self._cond:
            return {"size": self.size, "running": self.size - self._free, "waiting": len(self._queue)}


class Inflight:
    """The service's pools of work slots, and its stopping flag (set by the server on SIGTERM)."""

    def __init__(
        self, light: int = LIGHT_SLOTS, heavy: int = HEAVY_SLOTS, max_waiting: int = MAX_WAITING, wait_s: float = WAIT_S
    ):
        self.stopping = threading.Event()
        self.running: set[threading.Event] = set()  # one per request or background search in flight: set to stop it
        self.searches: set[object] = set()  # the searches among them (/health reports how many)
        self.light, self.heavy = Slots("light", light, max_waiting), Slots("heavy", heavy, max_waiting)
        self.wait_s = wait_s

    def stop_all(self) -> None:
        self.stopping.set()
        for stop in list(self.running):
            stop.set()

    @contextlib.contextmanager
    def searching(self, token):
        """Count a search as in flight while it runs."""
        self.searches.add(token)
        try:
            yield
        finally:
            self.searches.discard(token)

    async def run(self, request: Request, work: Callable, *args, slots: Slots | None = None):
        """``work(*args)`` on a worker thread once a slot of ``slots`` (default: light) is free, under a stop flag
        (gnn.cancel) set when the client hangs up or the service stops; its result, or Unavailable."""
        slots = slots or self.light
        if self.stopping.is_set():
            raise Unavailable("the service is shutting down")
        ticket = slots.join()
        try:
            await self._wait(request, slots, ticket)
        except BaseException:
            slots.leave(ticket)
            raise
        stop = threading.Event()
        self.running.add(stop)
        try:
            future = asyncio.ensure_future(asyncio.to_thread(_stoppable, work, args, stop))
            return await self._watch(request, future, stop)
        finally:
            stop.set()
            self.running.discard(stop)
            slots.release()

    async def _wait(self, request: Request, slots: Slots, ticket: object) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        look = loop.time() + POLL_S
        while not slots.take(ticket):
            if self.stopping.is_set():
                raise Unavailable("the service is shutting down")
            now = loop.time()
            if now >= deadline:
                state = slots.status()
                raise Unavailable(
                    f"the service is busy: no {slots.name} slot came free within {self.wait_s:.0f} s "
                    f"({state['running']} running, {state['waiting']} waiting); retry later"
                )
            if now >= look:
                if await request.is_disconnected():
                    raise cancel.Cancelled("the client hung up while the request waited for a slot")
                look = now + POLL_S
            await asyncio.sleep(HANDOFF_S)

    async def _watch(self, request: Request, future: asyncio.Future, stop: threading.Event):
        while not future.done():
            await asyncio.wait({future}, timeout=POLL_S)
            if future.done():
                break
            if self.stopping.is_set():
                stop.set()
                # answered now; the thread stops at its next check and nobody reads what it raises
                future.add_done_callback(lambda f: f.exception())
                raise Unavailable("the service is shutting down; the request was not finished")
            if await request.is_disconnected():
                stop.set()
        return future.result()


def _stoppable(work: Callable, args: tuple, stop: threading.Event):
    with cancel.stop_when(stop.is_set):
        return work(*args)


def parse_body(body: bytes, model):
    """The body as ``model``, validated as FastAPI would (errors located under "body"), on the caller's thread.
    json.loads reads UTF-8 (with or without a BOM), UTF-16 and UTF-32, as FastAPI's own body parsing does."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        raise _invalid(("body", e.pos), "JSON decode error: " + e.msg, "json_invalid") from None
    except UnicodeDecodeError:
        raise _invalid(("body",), "the body is not UTF-8, UTF-16 or UTF-32 text", "json_invalid") from None
    except RecursionError:
        raise _invalid(("body",), "the body is nested too deeply to be a request", "json_invalid") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise _invalid(("body",), f"the body is not a request: {str(e)[:120]}", "json_invalid") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", *err.get("loc", ()))} for err in e.errors(include_input=False)]
        raise RequestValidationError(errors) from None
    except RecursionError:
        raise _invalid(("body",), "the body is nested too deeply to be a request", "json_invalid") from None


def _invalid(loc: tuple, msg: str, kind: str) -> RequestValidationError:
    return RequestValidationError([{"loc": loc, "msg": msg, "type": kind}])


def request_body(model) -> dict:
    """The OpenAPI requestBody of an endpoint that reads its body itself: the model, by reference."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def install_request_schemas(app, *models) -> None:
    """Put ``models`` (and the models they use) in the app's OpenAPI components, where request_body points."""
    default = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = default()
            _, defs = models_json_schema([(m, "validation") for m in models], ref_template=REF_TEMPLATE)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, sub in defs.get("$defs", {}).items():
                components.setdefault(name, sub)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


REF_TEMPLATE = "#/components/schemas/{model}"
