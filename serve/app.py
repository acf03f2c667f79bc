"""The HTTP service: FastAPI over the predictor, on 127.0.0.1 by default.

    python -m serve serve [--port 8000] [--host 127.0.0.1] [--model models:/plansight@champion]   (make serve PORT=)

POST /predict takes and returns what `python -m serve predict` does; POST
/search runs a plan search (in memory; the CLI keeps studies in RDB storage);
GET /health; GET /model names the loaded model, its version and validation
metrics. OpenAPI docs at /docs. Invalid requests get 422 naming the field and
the rule (never echoing the body); bodies over the size limit get 413, stalled
ones 408 (serve/guard.py); a search whose client hangs up stops; SIGTERM
stops within seconds; the process survives any request. The featurisation workers start in the background at start-up
(--no-warm: on the first large request), so the first large batch does not
wait for them to import torch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import threading

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from collect.hardware.records import UnknownHardware
from gnn.inference.predictor import BatchPredictor
from serve.api import load_predictor, model_summary, predict
from serve.guard import BODY_CHUNK_TIMEOUT_S, MAX_BODY_BYTES, BodyGuard, with_timeouts
from serve.schemas import PredictRequest, PredictResponse, SearchRequest, SearchResponse
from serve.search.study import SearchCancelled, search

MAX_ERRORS_SHOWN = 50
SHUTDOWN_GRACE_S = 3  # SIGTERM: requests in flight get this long, then searches stop at their next batch
DISCONNECT_POLL_S = 0.5
log = logging.getLogger("plansight.serve")


def problems(errors: list[dict]) -> list[dict]:
    """Pydantic's errors as the field and the rule only: never the input (it can be megabytes, or hold NaN,
    which JSON cannot carry)."""
    shown = [
        {
            "loc": [str(part) if not isinstance(part, int) else part for part in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in errors[:MAX_ERRORS_SHOWN]
    ]
    if len(errors) > MAX_ERRORS_SHOWN:
        shown.append({"loc": [], "msg": f"... and {len(errors) - MAX_ERRORS_SHOWN} more", "type": "truncated"})
    return shown


def create_app(
    predictor: BatchPredictor, max_body_bytes: int = MAX_BODY_BYTES, client_timeout_s: float = BODY_CHUNK_TIMEOUT_S
) -> FastAPI:
    searches: set[threading.Event] = set()  # one per /search in flight: set to stop it

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        for stop in list(searches):  # shutting down: every search stops at its next batch
            stop.set()

    app = FastAPI(
        title="plansight",
        summary="Predict iteration time and peak memory of distributed training plans",
        version="1",
        lifespan=lifespan,
    )
    app.add_middleware(BodyGuard, max_body_bytes=max_body_bytes, chunk_timeout_s=client_timeout_s)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        return JSONResponse(status_code=422, content={"detail": problems(exc.errors())})

    @app.exception_handler(UnknownHardware)
    async def unknown_hardware(request: Request, exc: UnknownHardware):
        return JSONResponse(
            status_code=422,
            content={"detail": [{"loc": ["body", "cluster"], "msg": str(exc), "type": "unknown_hardware"}]},
        )

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        log.exception("request %s failed", request.url.path)
        return JSONResponse(status_code=500, content={"detail": f"internal error: {type(exc).__name__}"})

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "model_loaded": True, "searches_in_flight": len(searches)}

    @app.get("/model")
    def model() -> dict:
        return {**model_summary(predictor), "metrics": predictor.info.get("metrics", {})}

    # plain `def`: FastAPI runs these on its thread pool, so a long batch never blocks /health
    @app.post("/predict", response_model=PredictResponse)
    def predict_plans(request: PredictRequest) -> Response:
        # serialised here: returned as a model, FastAPI would validate all of it again against response_model
        # (which still gives the OpenAPI schema), ~15 ms for 2,000 plans
        return Response(predict(predictor, request).model_dump_json(), media_type="application/json")

    @app.post("/search", response_model=SearchResponse)
    async def search_plans(body: SearchRequest, request: Request):
        # on a worker thread, watched from here: a client that hangs up stops its search at the next batch
        stop = threading.Event()
        searches.add(stop)
        work = asyncio.ensure_future(asyncio.to_thread(search, predictor, body, None, should_stop=stop.is_set))
        try:
            while not work.done():
                await asyncio.wait({work}, timeout=DISCONNECT_POLL_S)
                if not work.done() and await request.is_disconnected():
                    stop.set()
            return work.result()
        except SearchCancelled as e:
            return JSONResponse(status_code=503, content={"detail": str(e)})
        finally:
            stop.set()
            searches.discard(stop)

    return app


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
    args = parser.parse_args(argv)
    try:
        predictor = load_predictor(args.model)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    predictor.warm_up()
    # what is loaded now (torch, the model, the web stack) stays: kept out of the collector's full collections,
    # which walked all of it, ~0.5 s in every few 2,000-plan requests
    gc.freeze()
    if not args.no_warm:  # in the background: the service answers while its workers import torch
        threading.Thread(target=predictor.start_workers, name="warm-workers", daemon=True).start()
    where = f"http://{args.host}:{args.port}"
    print(f"plansight: serving {predictor.info.get('uri', args.model)} on {where} (docs at /docs)")
    protocol, timeout_s = with_timeouts(args.client_timeout)
    uvicorn.run(
        create_app(predictor, client_timeout_s=timeout_s),
        host=args.host,
        port=args.port,
        log_level="warning",
        http=protocol,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
