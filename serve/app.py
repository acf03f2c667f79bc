"""The HTTP service: FastAPI over the predictor, on 127.0.0.1 by default.

    python -m serve serve [--port 8000] [--host 127.0.0.1] [--model models:/plansight@champion]   (make serve PORT=)

POST /predict takes and returns what `python -m serve predict` does; POST
/search runs a plan search (in memory; the CLI keeps studies in RDB storage);
GET /health; GET /model names the loaded model, its version and validation
metrics. OpenAPI docs at /docs. Invalid requests get 422 naming the field and
the rule; bodies over the size limit get 413; the process survives any
request. The featurisation workers start in the background at start-up
(--no-warm: on the first large request), so the first large batch does not
wait for them to import torch.
"""
from __future__ import annotations

import argparse
import gc
import logging
import os
import threading

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from gnn.predictor import Predictor
from serve.predictor import load_predictor, model_summary, predict
from serve.schemas import PredictRequest, PredictResponse, SearchRequest, SearchResponse

MAX_BODY_BYTES = 8 * 2**20
log = logging.getLogger("plansight.serve")


class BodyLimit:
    """Answers 413 to a request whose Content-Length is over the limit, before anything reads its body. Plain
    ASGI: @app.middleware("http") builds Starlette's BaseHTTPMiddleware, which streams every response through a
    task group (~1 ms of a single-plan request's ~8 ms in the server)."""

    def __init__(self, app, max_body_bytes: int):
        self.app, self.max_body_bytes = app, max_body_bytes

    async def __call__(self, scope, receive, send):
        length = dict(scope.get("headers", ())).get(b"content-length") if scope["type"] == "http" else None
        if length is not None and int(length) > self.max_body_bytes:
            detail = f"request body of {int(length)} bytes is over the limit of {self.max_body_bytes} bytes"
            return await JSONResponse(status_code=413, content={"detail": detail})(scope, receive, send)
        return await self.app(scope, receive, send)


def create_app(predictor: Predictor, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="plansight", summary="Predict iteration time and peak memory of distributed training plans",
                  version="1")
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        log.exception("request %s failed", request.url.path)
        return JSONResponse(status_code=500, content={"detail": f"internal error: {type(exc).__name__}: {exc}"})

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "model_loaded": True}

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
    def search_plans(request: SearchRequest) -> SearchResponse:
        from serve.search import search

        return search(predictor, request, storage=None)

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m serve serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))
    parser.add_argument("--model", default=os.environ.get("PLANSIGHT_MODEL", "models:/plansight@champion"))
    parser.add_argument("--no-warm", action="store_true",
                        help="start the featurisation workers on the first large request, not at start-up")
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
    print(f"plansight: serving {predictor.info.get('uri', args.model)} on http://{args.host}:{args.port} (docs at /docs)")
    uvicorn.run(create_app(predictor), host=args.host, port=args.port, log_level="warning")
