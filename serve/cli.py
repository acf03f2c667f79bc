"""The shell front end: read a request file, validate it, print JSON or a table.

    python -m serve predict SPEC.json [--model URI]     -> {"model": ..., "predictions": [...]} on stdout
    python -m serve search SEARCH.json [--plot out.png] -> the top plans as a table
    python -m serve serve [--port 8000]                 -> the HTTP service (make serve)
"""
from __future__ import annotations

import json
import sys

from pydantic import BaseModel

from collect.inputs import InputError, load_model


class RequestError(SystemExit):
    """Bad input from the shell: the message goes to stderr and the exit status is 2 (usage error)."""

    def __init__(self, message: str):
        print(message, file=sys.stderr)
        super().__init__(2)


def load_request(path: str, model: type[BaseModel]):
    """Parse and validate; on bad input, exit 2 with every problem and the field it concerns."""
    try:
        return load_model(path, model)
    except InputError as e:
        raise RequestError(str(e)) from None


def plan_label(plan, micro_batch_size: int) -> str:
    parts = [f"dp{plan.dp} tp{plan.tp} pp{plan.pp}", plan.sharding, f"recompute={plan.recompute}",
             f"mbs={micro_batch_size} x{plan.num_microbatches}"]
    if plan.pp > 1:
        parts.append(plan.pp_schedule + (f"/v{plan.virtual_stages}" if plan.virtual_stages > 1 else ""))
    if plan.sequence_parallel:
        parts.append("sp")
    return " ".join(parts)


def print_table(response) -> None:
    from tabulate import tabulate

    rows = []
    for i, r in enumerate(response.best, 1):
        p = r.prediction
        lo, hi = p.iter_time_interval_s
        rows.append([i, plan_label(r.plan, r.micro_batch_size), f"{p.iter_time_s * 1e3:.1f}",
                     f"{lo * 1e3:.1f}-{hi * 1e3:.1f}", f"{p.peak_mem_bytes / 2**30:.2f}", "yes" if p.fits else "no",
                     f"{p.breakdown['compute']:.0%}/{p.breakdown['communication_exposed']:.0%}/{p.breakdown['bubble']:.0%}"])
    print(f"{response.objective} search ({response.sampler}): {response.trials} trials ({response.feasible_trials} feasible) "
          f"over a space of {response.space_size} plans; model {response.model.get('uri', response.model.get('run_id'))}")
    print(tabulate(rows, headers=["#", "plan", "time ms", "80% interval", "peak GiB", "fits", "compute/comm/bubble"]))
    if response.pareto:
        print(f"Pareto front (time vs memory): {len(response.pareto)} plans")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("predict", "search", "serve"):
        print(__doc__, file=sys.stderr)
        raise SystemExit(2)
    command, rest = argv[0], argv[1:]
    if command == "search":
        from serve.search import main as search_main

        return search_main(rest)
    if command == "serve":
        from serve.app import main as serve_main

        return serve_main(rest)
    import argparse
    import os

    parser = argparse.ArgumentParser(prog="python -m serve predict")
    parser.add_argument("spec", help='SPEC.json: {"workload": {...}, "cluster": {...}, "plans": [{...}, ...]}')
    parser.add_argument("--model", default=os.environ.get("PLANSIGHT_MODEL", "models:/plansight@champion"))
    args = parser.parse_args(rest)
    from collect.hardware import UnknownHardware
    from serve.predictor import load_predictor, predict
    from serve.schemas import PredictRequest

    request = load_request(args.spec, PredictRequest)
    try:
        predictor = load_predictor(args.model)
    except ValueError as e:
        raise RequestError(f"error: {e}") from None
    try:
        response = predict(predictor, request)
    except UnknownHardware as e:
        raise RequestError(f"error: {args.spec}: cluster: {e}") from None
    print(json.dumps(response.model_dump(mode="json"), indent=1))
