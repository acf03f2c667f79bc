"""The shell front end of a prediction: read a request file, validate it, print the predictions as JSON.

    python -m serve predict SPEC.json [--model URI] [--probe NAME]  -> {"model": ..., "predictions": [...]} on stdout
    python -m serve probe NAME [--model URI]                         -> what a probe's runs correct (collect.probe)

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
from gnn.inference.probe import RUNS_DIR, check_probe, fit_correction, hardware_kind, load_probe
from serve.api import load_predictor, predict
from serve.schemas import PredictRequest

DEFAULT_MODEL = os.environ.get("PLANSIGHT_MODEL", "models:/plansight@champion")


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
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--probe", default=None, help="a probe measured on the machine (python -m collect probe)")
    parser.add_argument(
        "--probe-any-hardware", action="store_true", help="apply a probe measured on another kind of device anyway"
    )
    args = parser.parse_args(argv)
    request = load_request(args.spec, PredictRequest)
    if args.probe is not None:
        try:  # what the request's own probe field is checked for (serve.schemas.PredictRequest), before any work
            check_probe(args.probe, hardware_kind(request.cluster.record), args.probe_any_hardware)
        except ValueError as e:
            raise RequestError(f"error: --probe: {e}") from None
        request = request.model_copy(update={"probe": args.probe, "probe_any_hardware": args.probe_any_hardware})
    predictor = _predictor(args.model)
    try:
        response = predict(predictor, request)
    except UnknownHardware as e:
        raise RequestError(f"error: {args.spec}: cluster: {e}") from None
    print(json.dumps(response.model_dump(mode="json"), indent=1))


def probe_main(argv: list[str] | None = None) -> None:
    """python -m serve probe NAME [--model URI]: each probe run predicted and measured, and the correction."""
    parser = argparse.ArgumentParser(prog="python -m serve probe")
    parser.add_argument("name", help="the probe's name (python -m collect probe prints it)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--runs", default=RUNS_DIR, help="where the probe's rows are")
    parser.add_argument("--hardware", default=None, help="where its fingerprint is (default: the model's own)")
    args = parser.parse_args(argv)
    try:
        rows = load_probe(args.name, args.runs)
    except ValueError as e:
        raise RequestError(f"error: {e}") from None
    predictor = _predictor(args.model)
    if args.hardware:
        predictor.hardware_dir = args.hardware
    predicted = predictor.predict_rows(rows)["iter_time_s"].to_numpy()
    correction = fit_correction(predictor, rows, args.name)
    for (_, row), p in zip(rows.iterrows(), predicted):
        plan = (f"{row['family']} ws{row['world_size']} dp{row['dp']} tp{row['tp']} pp{row['pp']} {row['sharding']} "
                f"mbs{row['micro_batch_size']} x{row['num_microbatches']} {row['recompute']}")  # fmt: skip
        print(f"  {plan:<56} measured {row['iter_time_s']:.4g} s, predicted {p:.4g} s ({row['iter_time_s'] / p:.2f}x)")
    print(f"{args.name}: {correction.runs} runs on {rows['fingerprint_id'].iloc[0]}; times x factor (log sd):")
    for ws in sorted(set(rows["world_size"].astype(int))):
        s = correction.summary(ws)
        print(f"  world size {ws}: x {s['time_factor']:.3f} ({s['log_sd']:.3f})")
    print(f"predict with --probe {args.name}")


def _predictor(model: str):
    try:
        return load_predictor(model)
    except ValueError as e:
        raise RequestError(f"error: {e}") from None
