"""python -m serve verify SPEC.json [--model URI] [--budget-s 3600] [--json]

The plans of a predict request (the same file python -m serve predict reads) traced under fake tensors, one after
another: the model's predicted peak and interval, the traced peak of the busiest stage (both allocated), their ratio,
that peak with what a GPU adds (collect.fake.device.on_device), and whether it fits. --json prints
serve.verify.run.VerifyResponse instead.
Bad input, or plans estimated over the budget, exit 2 saying why.
"""

from __future__ import annotations

import argparse
import json
import sys

from serve.cli import DEFAULT_MODEL, RequestError, _predictor, load_request
from serve.schemas import PredictRequest
from serve.verify.cost import CLI_SECONDS, VerifyRefused, within_budget
from serve.verify.run import VerifiedPlan, VerifyResponse, verify

GiB = 2**30


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serve verify", description=__doc__.split("\n\n")[1])
    parser.add_argument("spec", help='SPEC.json: {"workload": {...}, "cluster": {...}, "plans": [{...}, ...]}')
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--budget-s", type=float, default=CLI_SECONDS, help="estimated seconds of tracing, at most")
    parser.add_argument("--json", action="store_true", help="print the whole response as JSON")
    args = parser.parse_args(argv)
    request = load_request(args.spec, PredictRequest)
    try:  # before loading the model: a request over its budget is refused at once
        estimates = within_budget(request.specs(), args.budget_s, f"--budget-s {args.budget_s:.0f}")
    except VerifyRefused as e:
        raise RequestError(f"error: {args.spec}: {e}") from None
    if not args.json:
        print(f"tracing {len(estimates)} plan(s) under fake tensors, estimated {sum(estimates):.0f} s at most",
              file=sys.stderr)  # fmt: skip
    response = verify(_predictor(args.model), request, args.budget_s)
    print(json.dumps(response.model_dump(mode="json"), indent=1) if args.json else table(response))


def table(response: VerifyResponse) -> str:
    """One line per plan: predicted and traced peak, the ratio, and the verdicts."""
    head = f"{'plan':>4}  {'predicted GiB (80%)':<22} {'traced GiB':>10} {'on GPU':>7} {'pred/tr':>8}"
    head += f"  {'in 80%':<6} fits  took"
    lines = [head]
    for i, p in enumerate(response.plans, 1):
        lines.append(f"{i:>4}  {_predicted(p):<22} {_traced(p)}")
    capacity = response.capacity_bytes / GiB
    lines.append(f"device memory {capacity:.1f} GiB; 'on GPU' adds to the trace what a GPU adds at the median, and "
                 "fits sets that beside the memory; "
                 f"not counted: {response.unseen}")  # fmt: skip
    return "\n".join(lines)


def _predicted(p: VerifiedPlan) -> str:
    lo, hi = p.prediction.peak_mem_interval_bytes
    return f"{p.prediction.peak_mem_bytes / GiB:.1f} ({lo / GiB:.1f}-{hi / GiB:.1f})"


def _traced(p: VerifiedPlan) -> str:
    if p.status != "ok":
        return f"{'-':>10} {'-':>7} {'-':>8}  {p.status}: {p.error or 'the budget was spent'}"
    took = f"{p.wall_s:.0f} s" if p.wall_s is not None else ""
    inside, fits = "yes" if p.within_interval else "no", "yes" if p.traced_fits else "no"
    traced, on_gpu, ratio = p.traced_peak_bytes / GiB, p.traced_on_gpu_bytes / GiB, p.predicted_over_traced
    return f"{traced:>10.1f} {on_gpu:>7.1f} {ratio:>8.2f}  {inside:<6} {fits:<4}  {took}"
