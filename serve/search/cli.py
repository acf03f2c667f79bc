"""The plan search from the shell: a SearchRequest file, or a workload and a cluster, to the table of the best plans
(one line per plan) and, with --plot, their Pareto front (time vs peak memory) or the top plans as a PNG.

python -m serve search SEARCH.json [--plot out.png]
python -m serve search --workload W.json --cluster a100-80gb [--nodes 2] [--objective pareto] [--trials 200]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from collect.inputs import InputError, read_json  # noqa: E402
from collect.schema import FRAMEWORKS  # noqa: E402
from serve.api import load_predictor  # noqa: E402
from serve.cli import RequestError, load_request  # noqa: E402
from serve.schemas import SearchRequest, SearchResponse  # noqa: E402
from serve.search.budget import SearchRefused, estimate  # noqa: E402
from serve.search.space import space_of  # noqa: E402
from serve.search.storage import StorageUnavailable  # noqa: E402
from serve.search.study import DEFAULT_STORAGE, search  # noqa: E402
from serve.shell.tables import plan_label, search_table  # noqa: E402


def build_request(args) -> SearchRequest:
    """From a SearchRequest file, or from --workload (JSON file or text) and --cluster (preset name or JSON)."""
    if args.request:
        return load_request(args.request, SearchRequest)
    if not args.workload or not args.cluster:
        raise RequestError("error: give a SEARCH.json, or --workload and --cluster")
    try:  # a file read as the HTTP service reads a body (a BOM, UTF-16), or the JSON itself
        workload = read_json(args.workload) if Path(args.workload).is_file() else json.loads(args.workload)
        cluster = json.loads(args.cluster) if args.cluster.lstrip().startswith("{") else {"preset": args.cluster}
        if isinstance(cluster, dict):  # --nodes counts for cluster JSON too, unless it says its own
            cluster.setdefault("nodes", args.nodes)
    except InputError as e:
        raise RequestError(str(e)) from None
    except (ValueError, RecursionError) as e:
        raise RequestError(f"error: --workload or --cluster is not JSON: {str(e)[:200]}") from None
    body = {
        "workload": workload,
        "cluster": cluster,
        "objective": args.objective,
        "trials": args.trials,
        "sampler": args.sampler,
        "framework": args.framework,
    }
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"plansight-search-{os.getpid()}.json"
    tmp.write_text(json.dumps(body))
    try:
        return load_request(str(tmp), SearchRequest)
    finally:
        tmp.unlink()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serve search", description=__doc__.split("\n\n")[0])
    parser.add_argument("request", nargs="?", help="SEARCH.json with a SearchRequest")
    parser.add_argument("--workload", help="workload JSON (a file or inline) with its global_batch_size")
    parser.add_argument("--cluster", help="a preset name (a100-80gb) or cluster JSON")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--objective", choices=["time", "pareto"], default="time")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument(
        "--framework", choices=FRAMEWORKS, default="torch", help="whose conventions the plans take (memory)"
    )
    parser.add_argument(
        "--sampler",
        choices=["auto", "optuna", "exhaustive"],
        default="auto",
        help="auto: every plan when the space has at most --trials plans, else Optuna",
    )
    parser.add_argument("--model", default=os.environ.get("PLANSIGHT_MODEL", "models:/plansight@champion"))
    parser.add_argument("--storage", default=os.environ.get("OPTUNA_STORAGE", DEFAULT_STORAGE))
    parser.add_argument("--plot", default=None, help="write the Pareto front (or the top plans) to this PNG")
    args = parser.parse_args(argv)
    request = build_request(args)
    try:
        predictor = load_predictor(args.model)
    except ValueError as e:
        raise RequestError(f"error: {e}") from None
    space = space_of(request)
    priced = estimate(request, space, stored=bool(args.storage))  # said, not enforced: the shell has no budget
    print(f"search: {priced.plans:,} plans by {priced.sampler}, estimated at {priced.seconds:,.1f} s of work here",
          file=sys.stderr)  # fmt: skip
    try:
        response = search(predictor, request, args.storage, sys.stderr.isatty(), space=space, estimated=priced)
    except SearchRefused as e:
        raise RequestError(f"error: {e}") from None
    except StorageUnavailable as e:  # not a usage error (status 1): the database named is down or unreachable
        raise SystemExit(f"error: {e}") from None
    print_table(response, request.time_quantile)
    if args.plot:
        print(f"plot: {plot_search(response, args.plot)}")


def print_table(response: SearchResponse, quantile: float = 0.5) -> None:
    print(search_table(response, quantile))


def plot_search(response, path: str | Path) -> Path:
    points = response.pareto or response.best
    fig, ax = plt.subplots(figsize=(7, 4.5))
    t = [r.prediction.iter_time_s * 1e3 for r in points]
    m = [r.prediction.peak_mem_bytes / 2**30 for r in points]
    lo = [r.prediction.iter_time_s * 1e3 - r.prediction.iter_time_interval_s[0] * 1e3 for r in points]
    hi = [r.prediction.iter_time_interval_s[1] * 1e3 - r.prediction.iter_time_s * 1e3 for r in points]
    ax.errorbar(t, m, xerr=[lo, hi], fmt="o-" if response.pareto else "o", capsize=3)
    for r, x, y in zip(points[:8], t, m):
        ax.annotate(
            plan_label(r.plan, r.micro_batch_size, r.float8),
            (x, y),
            fontsize=6,
            xytext=(4, 4),
            textcoords="offset points",
        )
    ax.set(
        xlabel="predicted iteration time (ms), 80% interval",
        ylabel="predicted peak memory per device (GiB)",
        title=("Pareto front" if response.pareto else "top plans") + f", {response.trials} trials",
    )
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
