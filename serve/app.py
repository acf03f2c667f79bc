"""The HTTP service: FastAPI over the predictor, on 127.0.0.1 by default.

    python -m serve serve [--port 8000] [--host 127.0.0.1] [--model models:/plansight@champion]   (make serve PORT=)

POST /predict takes and returns what `python -m serve predict` does; POST
/search runs a plan search (in memory; the CLI keeps studies in RDB storage);
POST /verify traces a predict request's plans under fake tensors, as
`python -m serve verify` does, within serve.verify.cost.HTTP_SECONDS;
GET /health; GET /model names the loaded model, its version and validation
metrics; GET / is the plan explorer, a page in the browser (serve/page.py).
OpenAPI docs at /docs. Invalid requests get 422 naming the field and
the rule (never echoing the body), and requests whose estimated work is over the
budget (serve.schemas, gnn.inference.cost) are refused before any of it; bodies
over the size limit get 413, stalled or trickled ones 408 (serve/guard.py).
Bodies are parsed, validated and answered off the event loop (serve/inflight.py),
so /health answers while heavy requests run; a request whose client hangs up
stops; on SIGTERM requests in flight get 503 with Retry-After and the process
stops within seconds. The featurisation workers start in the background at
start-up (--no-warm: on the first large request), so the first large batch does
not wait for them to import torch.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import sys
import threading

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from collect.hardware.records import UnknownHardware
from gnn.cancel import Cancelled
from gnn.inference.predictor import BatchPredictor
from serve.api import load_predictor, model_summary, predict
from serve.guard import BODY_CHUNK_TIMEOUT_S, MAX_BODY_BYTES, BodyGuard, with_timeouts
from serve.inflight import (
    RETRY_AFTER_S,
    WAIT_S,
    Inflight,
    Unavailable,
    install_request_schemas,
    parse_body,
    request_body,
)
from serve.page import install_page, warm_up_explain
from serve.schemas import ExplainRequest, PredictRequest, PredictResponse, SearchRequest, SearchResponse
from serve.search.budget import JOB, SEARCH, Budget, Meter, SearchRefused, checked
from serve.search.study import search
from serve.verify.cost import HTTP_SECONDS, VerifyRefused, within_budget
from serve.verify.run import VerifyResponse, verify

MAX_ERRORS_SHOWN = 50
SWITCH_INTERVAL_S = 0.001
SHUTDOWN_GRACE_S = 3  # SIGTERM: work in flight is told at once (StoppingServer); connections get this long to close
log = logging.getLogger("plansight.serve")


MAX_MESSAGE_CHARS = 400  # a message quoting a value is cut here: a 422 never echoes megabytes back


def problems(errors: list[dict]) -> list[dict]:
    """Pydantic's errors as the field and the rule only: never the input (it can be megabytes, or hold NaN,
    which JSON cannot carry), and each message at most MAX_MESSAGE_CHARS."""
    shown = [
        {
            "loc": [_short(str(part)) if not isinstance(part, int) else part for part in e.get("loc", ())],
            "msg": _short(str(e.get("msg", ""))),
            "type": str(e.get("type", "")),
        }
        for e in errors[:MAX_ERRORS_SHOWN]
    ]
    if len(errors) > MAX_ERRORS_SHOWN:
        shown.append({"loc": [], "msg": f"... and {len(errors) - MAX_ERRORS_SHOWN} more", "type": "truncated"})
    return shown


def _short(text: str) -> str:
    cut = MAX_MESSAGE_CHARS
    return text if len(text) <= cut else f"{text[:cut]}... ({len(text)} characters in all)"


def create_app(
    predictor: BatchPredictor,
    max_body_bytes: int = MAX_BODY_BYTES,
    client_timeout_s: float = BODY_CHUNK_TIMEOUT_S,
    wait_s: float = WAIT_S,
    job_budget: Budget = JOB,
) -> FastAPI:
    """``wait_s``: how long a request waits for a slot before 503; ``job_budget``: a background search's."""
    inflight = Inflight(wait_s=wait_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        inflight.stop_all()  # shutting down: work still running stops at its next chunk or batch

    app = FastAPI(
        title="plansight",
        summary="Predict iteration time and peak memory of distributed training plans",
        version="1",
        lifespan=lifespan,
    )
    app.state.inflight = inflight
    app.add_middleware(BodyGuard, max_body_bytes=max_body_bytes, chunk_timeout_s=client_timeout_s)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        return JSONResponse(status_code=422, content={"detail": problems(exc.errors())})

    @app.exception_handler(UnknownHardware)
    async def unknown_hardware(request: Request, exc: UnknownHardware):
        return JSONResponse(
            status_code=422,
            content={"detail": [{"loc": ["body", "cluster"], "msg": _short(str(exc)), "type": "unknown_hardware"}]},
        )

    @app.exception_handler(SearchRefused)
    async def refused_search(request: Request, exc: SearchRefused):
        detail = [{"loc": ["body", exc.field], "msg": _short(str(exc)), "type": "search_over_budget"}]
        return JSONResponse(status_code=422, content={"detail": detail})

    @app.exception_handler(VerifyRefused)
    async def refused_verify(request: Request, exc: VerifyRefused):
        detail = [{"loc": ["body", "plans"], "msg": _short(str(exc)), "type": "verify_over_budget"}]
        return JSONResponse(status_code=422, content={"detail": detail})

    @app.exception_handler(Unavailable)
    @app.exception_handler(Cancelled)
    async def unavailable(request: Request, exc: Exception):
        """503: shutting down, too busy, or work told to stop (its client gone, or the service stopping)."""
        headers = {"Retry-After": str(RETRY_AFTER_S)}
        return JSONResponse(status_code=503, content={"detail": str(exc)}, headers=headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        if inflight.stopping.is_set():  # whatever broke while shutting down, the client may retry elsewhere
            return await unavailable(request, Unavailable("the service is shutting down"))
        log.exception("request %s failed", request.url.path)
        return JSONResponse(status_code=500, content={"detail": f"internal error: {type(exc).__name__}"})

    # the quick routes run on the event loop itself (async def): a sync route is handed to a thread, and with two
    # searches holding the GIL every hand-off waits its turn
    @app.get("/health")
    async def health() -> dict:
        return {
            "status": "stopping" if inflight.stopping.is_set() else "ok",
            "model_loaded": True,
            "requests_in_flight": len(inflight.running),
            "searches_in_flight": len(inflight.searches),
            "slots": {"light": inflight.light.status(), "heavy": inflight.heavy.status()},
        }

    @app.get("/model")
    async def model() -> dict:
        return {**model_summary(predictor), "metrics": predictor.info.get("metrics", {})}

    # the body is parsed, validated and answered on a worker thread (serve.inflight): never on the event loop
    @app.post("/predict", response_model=PredictResponse, openapi_extra=request_body(PredictRequest))
    async def predict_plans(request: Request) -> Response:
        def work(body: bytes) -> str:
            # serialised here: returned as a model, FastAPI would validate all of it again against response_model
            # (which still gives the OpenAPI schema), ~15 ms for 2,000 plans
            return predict(predictor, parse_body(body, PredictRequest)).model_dump_json()

        return Response(await inflight.run(request, work, await request.body()), media_type="application/json")

    @app.post("/search", response_model=SearchResponse, openapi_extra=request_body(SearchRequest))
    async def search_plans(request: Request) -> Response:
        def check(body: bytes):  # a light slot: a search over its budget is refused without waiting for a heavy one
            parsed = parse_body(body, SearchRequest)
            return (parsed, *checked(parsed, SEARCH, refuse_over_time=True))

        def work(parsed: SearchRequest, space, priced) -> str:
            token = object()
            with inflight.searching(token):
                return search(predictor, parsed, space=space, meter=Meter(SEARCH), estimated=priced).model_dump_json()

        checked_request = await inflight.run(request, check, await request.body())
        answer = await inflight.run(request, work, *checked_request, slots=inflight.heavy)
        return Response(answer, media_type="application/json")

    @app.post("/verify", response_model=VerifyResponse, openapi_extra=request_body(PredictRequest))
    async def verify_plans(request: Request) -> Response:
        def check(body: bytes) -> PredictRequest:  # a light slot: over its budget is refused before any trace
            parsed = parse_body(body, PredictRequest)
            within_budget(parsed.specs(), HTTP_SECONDS, "POST /verify")
            return parsed

        parsed = await inflight.run(request, check, await request.body())
        answer = await inflight.run(request, _verified_json, predictor, parsed, slots=inflight.heavy)
        return Response(answer, media_type="application/json")

    install_page(app, predictor, inflight, job_budget)
    install_request_schemas(app, PredictRequest, SearchRequest, ExplainRequest)
    return app


def _verified_json(predictor: BatchPredictor, request: PredictRequest) -> str:
    return verify(predictor, request, HTTP_SECONDS).model_dump_json()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serve serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))
    parser.add_argument("--model", default=os.environ.get("PLANSIGHT_MODEL", "models:/plansight@champion"))
    parser.add_argument(
        "--no-warm",
        action="store_true",
        help="start the featurisation workers on the first large request, not at start-up",
    )
    parser.add_argument(
        "--client-timeout",
        type=float,
        default=BODY_CHUNK_TIMEOUT_S,
        metavar="SECONDS",
        help="close a connection whose request headers, or next body chunk, take longer than this",
    )
    parser.add_argument(
        "--slot-wait",
        type=float,
        default=WAIT_S,
        metavar="SECONDS",
        help=f"answer 503 to a request that waits longer than this for a work slot (default {WAIT_S:.0f})",
    )
    parser.add_argument(
        "--job-budget",
        type=float,
        default=JOB.seconds,
        metavar="SECONDS",
        help=f"a background search's budget of estimated work, where it stops (default {JOB.seconds:.0f})",
    )
    args = parser.parse_args(argv)
    try:
        predictor = load_predictor(args.model)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    predictor.warm_up()
    warm_up_explain(predictor)
    # a thread waiting for the GIL (the event loop, between two reads of a socket) gets it after at most this
    # long: at Python's default 5 ms, /health took up to 124 ms beside two searches' threads
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # what is loaded now (torch, the model, the web stack) stays: kept out of the collector's full collections,
    # which walked all of it, ~0.5 s in every few 2,000-plan requests
    gc.freeze()
    if not args.no_warm:  # in the background: the service answers while its workers import torch
        threading.Thread(target=predictor.start_workers, name="warm-workers", daemon=True).start()
    where = f"http://{args.host}:{args.port}"
    print(f"plansight: serving {predictor.info.get('uri', args.model)} on {where} (docs at /docs)")
    protocol, timeout_s = with_timeouts(args.client_timeout)
    job_budget = Budget(args.job_budget, JOB.bytes, JOB.name)
    app = create_app(predictor, client_timeout_s=timeout_s, wait_s=args.slot_wait, job_budget=job_budget)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        http=protocol,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    StoppingServer(config, app.state.inflight).run()


class StoppingServer(uvicorn.Server):
    """uvicorn's server, telling the app's work the moment SIGTERM or Ctrl-C arrives: requests in flight then get
    503 with Retry-After within a poll, rather than a 500 when uvicorn cancels them after its grace period."""

    def __init__(self, config: uvicorn.Config, inflight: Inflight):
        super().__init__(config)
        self.inflight = inflight

    def handle_exit(self, sig, frame) -> None:
        self.inflight.stop_all()
        super().handle_exit(sig, frame)
