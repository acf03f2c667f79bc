"""The service's requests as work off the event loop: parsed, validated and answered on worker threads, a few at
a time, each watched from the loop so that it stops when its client hangs up or the service shuts down.

Validating a request is work too (a plan's checks, an hf_config's arithmetic): FastAPI would run it on the event
loop, where one slow body stalled /health for everyone, so the endpoints take the raw body and hand it here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from pydantic.json_schema import models_json_schema

WORK_SLOTS = 2  # requests worked on at once: the machine's cores (each request is bounded by serve.schemas)
MAX_WAITING = 32  # requests waiting for a slot; past that the service answers 503 at once
POLL_S = 0.25  # how often a request in flight is checked for its client and for shutdown
RETRY_AFTER_S = 5


class Unavailable(Exception):
    """503 with Retry-After: the service is shutting down, or too busy to queue another request."""


class Inflight:
    """Slots for request work, and the service's stopping flag (set by the server on SIGTERM)."""

    def __init__(self, slots: int = WORK_SLOTS, max_waiting: int = MAX_WAITING):
        self.stopping = threading.Event()
        self.running: set[threading.Event] = set()  # one per request in flight: set to stop it
        self.searches: set[object] = set()  # the searches among them (/health reports how many)
        self._slots, self._waiting, self._max_waiting = slots, 0, max_waiting
        self._semaphore: asyncio.Semaphore | None = None  # made in the loop that uses it

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

    async def run(self, request: Request, work: Callable, *args):
        """``work(*args, should_stop)`` on a worker thread once a slot is free; its result, or Unavailable."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self._slots)
        if self.stopping.is_set():
            raise Unavailable("the service is shutting down")
        if self._waiting >= self._max_waiting:
            raise Unavailable(f"the service is busy: {self._waiting} requests are waiting for one of its slots")
        self._waiting += 1
        try:
            await self._semaphore.acquire()
        finally:
            self._waiting -= 1
        stop = threading.Event()
        self.running.add(stop)
        try:
            return await self._watch(request, asyncio.ensure_future(asyncio.to_thread(work, *args, stop.is_set)), stop)
        finally:
            stop.set()
            self.running.discard(stop)
            self._semaphore.release()

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
