"""The shell front end of a prediction: read a request file, validate it, print the predictions as a table.

    python -m serve predict SPEC.json [--model URI] [--probe NAME]  -> a line per plan: time, peak, fits, ...
    python -m serve predict SPEC.json --json                        -> {"model": ..., "predictions": [...]}
    python -m serve probe NAME [--model URI]                         -> what a probe's runs correct (collect.probe)
    python -m serve probe NAME --rows RUNS.csv [--model URI]         -> the same, of runs from a cluster's own logs

Bad input exits 2 with one line per problem (RequestError); serve.search.cli reads its files the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import pandas as pd
from pydantic import BaseModel, ValidationError

from collect.hardware.records import UnknownHardware
from collect.inputs import InputError, load_model
from collect.published.rows import spec_columns
from collect.schema import Plan, Workload
from gnn.inference.probe import (
    MAX_PROBE_RUNS,
    RUNS_DIR,
    check_probe,
    fit_correction,
    hardware_kind,
    load_probe,
    probe_path,
)
from serve.api import load_predictor, predict
from serve.schemas import ClusterSpec, PredictRequest
from serve.shell.tables import predict_table

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
    parser.add_argument("--json", action="store_true", help="the response as JSON (what POST /predict answers)")
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
    if args.json:
        print(json.dumps(response.model_dump(mode="json"), indent=1))
    else:
        moe = request.workload.family == "moe"
        print(predict_table(response, request.plans, request.workload.micro_batch_size, moe))


def probe_main(argv: list[str] | None = None) -> None:
    """python -m serve probe NAME [--model URI]: each probe run predicted and measured, and the correction."""
    parser = argparse.ArgumentParser(prog="python -m serve probe")
    parser.add_argument("name", help="the probe's name (python -m collect probe prints it)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--runs", default=RUNS_DIR, help="where the probe's rows are")
    parser.add_argument("--hardware", default=None, help="where its fingerprint is (default: the model's own)")
    parser.add_argument(
        "--rows",
        metavar="RUNS.csv",
        help="store runs from your cluster's logs as probe NAME first: one run per line, the fields of a request's "
        "workload, cluster and plan as columns, and the measured iter_time_s (and peak_mem_bytes, if known)",
    )
    args = parser.parse_args(argv)
    if args.rows:
        store_probe_rows(args.name, args.rows, args.runs)
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


MEASURED = ("iter_time_s", "peak_mem_bytes")
PARTS = (("workload", Workload), ("cluster", ClusterSpec), ("plan", Plan))  # a request's fields, by part
FIELDS = {part: set(model.model_fields) for part, model in PARTS}


def store_probe_rows(name: str, csv: str, runs_dir: str = RUNS_DIR) -> None:
    """A user's own measured runs (serve probe --rows) checked like every request, then stored as probe ``name``
    in data/runs' format; RequestError with every problem, by line and field, and nothing stored."""
    try:
        path = probe_path(name, runs_dir)
    except ValueError:  # no such probe yet: what we want
        path = None
    if path is not None:
        raise RequestError(f"error: --rows: probe {name!r} exists in {runs_dir}; give the new runs another name")
    try:
        table = pd.read_csv(csv)
    except (OSError, ValueError) as e:
        raise RequestError(f"error: --rows {csv}: {e}") from None
    rows, problems = _probe_rows(table, csv, name)
    if problems:
        raise RequestError("\n".join(problems[:20] + ([f"... and {len(problems) - 20} more"] if problems[20:] else [])))
    pd.DataFrame(rows).to_parquet(os.path.join(runs_dir, f"{name}.parquet"), index=False)


def _probe_rows(table: pd.DataFrame, csv: str, name: str) -> tuple[list[dict], list[str]]:
    known = set().union(*FIELDS.values(), MEASURED)
    problems = [f"{csv}: column {c!r}: not a field of a workload, cluster or plan, nor {' or '.join(MEASURED)}"
                for c in table.columns if c not in known]  # fmt: skip
    if "iter_time_s" not in table:
        problems.append(f"{csv}: column 'iter_time_s' is required: each run's measured seconds per iteration")
    if not 1 <= len(table) <= MAX_PROBE_RUNS:
        problems.append(f"{csv}: {len(table)} runs; a probe holds 1 to {MAX_PROBE_RUNS}")
    if problems:
        return [], problems
    rows = []
    for line, record in enumerate(table.to_dict("records"), start=2):  # the header is line 1
        values = {k: v.item() if hasattr(v, "item") else v for k, v in record.items() if not pd.isna(v)}
        parts = {part: {k: v for k, v in values.items() if k in fields} for part, fields in FIELDS.items()}
        try:
            plan = parts.pop("plan")
            request = PredictRequest.model_validate({**parts, "plans": [plan]})
        except ValidationError as e:
            problems += [f"{csv} line {line}: {_problem(err)}" for err in e.errors()]
            continue
        measured = {k: values.get(k) for k in MEASURED}
        bad = [k for k, v in measured.items() if v is not None and not (isinstance(v, (int, float)) and v > 0)]
        if measured["iter_time_s"] is None or bad:
            problems.append(f"{csv} line {line}: {(bad or ['iter_time_s'])[0]}: must be a positive number")
            continue
        spec = request.specs()[0]
        rows.append(spec_columns(spec, "probe", f"probe-{name}", request.cluster.hardware_name()) | {
            "status": "ok", "error": "", **measured, "source": f"{os.path.basename(csv)} line {line}",
        })  # fmt: skip
    return rows, problems


def _problem(error: dict) -> str:
    where, what = ".".join(map(str, error["loc"])), error["msg"].removeprefix("Value error, ")
    return f"{where}: {what}" if where else what
