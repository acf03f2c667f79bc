"""The shell front end of a prediction: read a request file, validate it, print the predictions as JSON.

    python -m serve predict SPEC.json [--model URI]     -> {"model": ..., "predictions": [...]} on stdout

Bad input exits 2 with one line per problem (RequestError); serve.search.cli reads its files the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pydantic import BaseModel

from collect.hardware.records import UnknownHardware
from collect.inputs import InputError, load_model
from serve.api import load_predictor, predict
from serve.schemas import PredictRequest


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


def main(argv: list[str] | None = None) -> None:
    """python -m serve predict SPEC.json [--model URI]"""
    parser = argparse.ArgumentParser(prog="python -m serve predict")
    parser.add_argument("spec", help='SPEC.json: {"workload": {...}, "cluster": {...}, "plans": [{...}, ...]}')
    parser.add_argument("--model", default=os.environ.get("PLANSIGHT_MODEL", "models:/plansight@champion"))
    args = parser.parse_args(argv)
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
