"""The plan explorer: a page in the browser over the same service (GET /), and the routes it reads.

GET /                  the page (serve/web: its own HTML, JavaScript and CSS, no CDN: it works offline)
GET /catalog           the bundled workloads and Hugging Face configs, the cluster presets, the measured
                       fingerprints, the frameworks and the limits: what the page's choices offer
POST /searches         a search in the background (serve.search.jobs): answers {"id"} at once
GET /searches/{id}     its progress, then the SearchResponse (as POST /search answers it) and every evaluated plan
DELETE /searches/{id}  cancel it
POST /explain          one plan (serve.schemas.ExplainRequest): its prediction, the memory of each pipeline rank
                       as the execution graph accounts it, and its simulated timeline as a PNG (gnn.explain)
"""

from __future__ import annotations

import base64
import json
from functools import lru_cache
from pathlib import Path
from typing import get_args

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from collect import REPO
from collect.hardware.records import PRESET_DIR, default_hardware_dir, load_hardware
from collect.schema.choices import Framework
from gnn.explain import explain
from gnn.inference.predictor import BatchPredictor
from gnn.inference.workers import WARM_UP_HARDWARE, warm_up_spec
from serve.api import predict
from serve.inflight import Inflight, parse_body, request_body
from serve.schemas import MAX_SEARCH_TRIALS, ExplainRequest, SearchRequest
from serve.search.budget import JOB, SEARCH, Budget, checked
from serve.search.jobs import Jobs
from serve.verify.cost import HTTP_SECONDS as VERIFY_SECONDS

WEB = Path(__file__).with_name("web")
REQUESTS = REPO / "experiments" / "requests"  # the bundled example workloads (data, not code: nothing is imported)
NO_STORE = {"Cache-Control": "no-store"}


def install_page(app: FastAPI, predictor: BatchPredictor, inflight: Inflight, job_budget: Budget = JOB) -> None:
    jobs = Jobs(predictor, inflight, job_budget)
    app.state.jobs = jobs
    app.mount("/static", StaticFiles(directory=WEB), name="static")

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(WEB / "index.html", headers=NO_STORE)

    @app.get("/catalog")
    def catalog_route() -> dict:
        return catalog(job_budget)

    @app.post("/searches", status_code=202, openapi_extra=request_body(SearchRequest))
    async def start_search(request: Request) -> JSONResponse:
        def work(body: bytes) -> dict:  # a light slot: validated and estimated, then queued for a heavy one
            parsed = parse_body(body, SearchRequest)
            return jobs.start(parsed, *checked(parsed, job_budget, refuse_over_time=False)).status()

        return JSONResponse(await inflight.run(request, work, await request.body()), status_code=202)

    @app.get("/searches/{job_id}")
    async def search_status(job_id: str) -> Response:
        job = jobs.get(job_id)
        if job is None:
            return JSONResponse({"detail": f"no search {job_id!r} (finished searches are kept a while)"}, 404)
        # the response is spliced in as it was serialised: the same bytes POST /search would answer
        status = json.dumps(job.status())
        body = status[:-1] + f', "response": {job.response or "null"}}}'
        return Response(body, media_type="application/json", headers=NO_STORE)

    @app.delete("/searches/{job_id}")
    async def cancel_search(job_id: str) -> JSONResponse:
        job = jobs.cancel(job_id)
        if job is None:
            return JSONResponse({"detail": f"no search {job_id!r}"}, 404)
        finishing = job.state in ("queued", "running")
        return JSONResponse({"id": job.id, "state": "cancelling" if finishing else job.state})

    @app.post("/explain", openapi_extra=request_body(ExplainRequest))
    async def explain_plan(request: Request) -> JSONResponse:
        parsed = await inflight.run(request, lambda body: parse_body(body, ExplainRequest), await request.body())
        return JSONResponse(await inflight.run(request, explained, predictor, parsed, slots=inflight.heavy))


def warm_up_explain(predictor: BatchPredictor) -> None:
    """Take a small plan apart once (gnn.inference.workers.warm_up_spec), so the first /explain does not pay for
    matplotlib's fonts and first figure (0.9 s of a 1.2 s small plan, where a warm one takes 0.2 s)."""
    explain(warm_up_spec(), WARM_UP_HARDWARE, predictor.hardware_dir)


def explained(predictor: BatchPredictor, request: ExplainRequest) -> dict:
    """The plan of ``request`` taken apart (gnn.explain), beside the model's prediction of it."""
    prediction = predict(predictor, request).predictions[0]
    parts = explain(request.specs()[0], request.cluster.hardware_name(), predictor.hardware_dir)
    png = base64.b64encode(parts.pop("timeline_png")).decode()
    return {"prediction": prediction.model_dump(mode="json"), **parts, "timeline_png": png}


@lru_cache(maxsize=1)
def _bundled() -> tuple[dict, dict]:
    requests = {p.stem: json.loads(p.read_text()) for p in sorted(REQUESTS.glob("*.json"))}
    configs = {p.name.removesuffix(".config.json"): json.loads(p.read_text()) for p in REQUESTS.glob("hf/*.json")}
    return requests, dict(sorted(configs.items()))


def catalog(job_budget: Budget = JOB) -> dict:
    requests, configs = _bundled()
    presets = []
    for path in sorted(PRESET_DIR.glob("*.json")):
        record = load_hardware(path.stem)
        presets.append(
            {
                "id": record["id"],
                "devices_per_node": record["devices_per_node"],
                "memory_bytes": record["memory_bytes"],
                "notes": record.get("notes", ""),
            }
        )
    fingerprints = sorted(p.stem for p in Path(default_hardware_dir()).glob("*.json"))
    return {
        "workloads": requests,
        "hf_configs": configs,
        "presets": presets,
        "fingerprints": fingerprints,
        "frameworks": list(get_args(Framework)),
        "objectives": ["time", "pareto"],
        "limits": {
            "max_trials": MAX_SEARCH_TRIALS,
            "max_top_k": 100,
            "search_budget_s": SEARCH.seconds,
            "background_budget_s": job_budget.seconds,
            "verify_budget_s": VERIFY_SECONDS,
        },
    }
