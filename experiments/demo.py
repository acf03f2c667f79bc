"""The main job end to end on the shipped data.

    python -m experiments.demo        (make demo)

1. The surrogate: the registered champion (models:/plansight@champion in the
   local MLflow store); on a fresh clone the one shipped in models/champion,
   registered first; only when that one reads other features than this code
   makes, a new ensemble trained on the shipped runs (all/random, minutes).
2. Its accuracy on the held-out test rows beside the baselines, per hardware
   domain, with the measured noise floor (all splits: `make evaluate`).
3. A plan search for a workload that was never measured (a 20-layer,
   1536-wide GPT on one 8 x A100-80GB node) and its top plans.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict

import pandas as pd

from collect import REPO
from experiments.evaluate import evaluate_predictor, noise_records
from gnn.dataset.graphs import PlanGraphs
from gnn.dataset.splits import SERVING_SPLIT, named_splits
from gnn.predictors.registry import BASELINE_NAMES
from gnn.predictors.surrogate import TrainConfig, train_ensemble
from gnn.tracking.logs import library_logs_to
from gnn.tracking.runs import log_surrogate, setup
from gnn.tracking.scoring import ensemble_records
from serve.api import load_predictor
from serve.schemas import SearchRequest
from serve.search.cli import print_table
from serve.search.study import search

SEARCH_WORKLOAD = REPO / "experiments" / "requests" / "gpt-20l-1536.json"
LOG = REPO / "build" / "demo.log"


def champion_or_train(ds, parts, max_epochs: int):
    try:
        predictor = load_predictor("models:/plansight@champion")
        print(f"[1/3] loaded the champion: {predictor.info.get('uri')} version {predictor.info.get('version')}")
        return predictor
    except ValueError:
        pass
    print(
        "[1/3] no usable champion (none registered, and the shipped one does not match this code's features): "
        "training the ensemble on the shipped runs (all/random)"
    )
    cfg = TrainConfig(max_epochs=max_epochs)
    start = time.perf_counter()
    ensemble = train_ensemble(ds, parts, cfg)
    print(log_surrogate(ensemble, ds, parts, SERVING_SPLIT, asdict(cfg), time.perf_counter() - start))
    return load_predictor("models:/plansight@champion")


def accuracy_table(ds, splits, predictor) -> str:
    records, _ = ensemble_records(predictor.ensemble, ds, splits[SERVING_SPLIT], "all/random", which=("test",))
    for r in records:
        r["split"] = "random"
    for split in [s for s in ("cpu/random", "a100/random", "h100/random") if s in splits]:
        records += [r for name in BASELINE_NAMES for r in evaluate_predictor(name, ds.meta, split, splits[split])]
    records += [r for r in noise_records(ds.meta, splits) if r["split"] == "random"]
    df = pd.DataFrame(records)
    errors = df[df.target.isin(["time", "memory"])]
    mape = errors.pivot_table(index=["domain", "target"], columns="predictor", values="mape", aggfunc="first") * 100
    cover = df[(df.predictor == "gnn") & df.target.isin(["time", "memory"])].set_index(["domain", "target"])["coverage"]
    mape["gnn 80% interval coverage"] = (cover * 100).round(0)
    oom = df[df.target == "oom"].pivot_table(index="domain", columns="predictor", values="accuracy", aggfunc="first")
    return (
        f"MAPE % on the random test rows (noise_floor: mean deviation of repeated measurements)\n"
        f"{mape.round(1).to_string()}\n\noom accuracy\n{oom.round(3).to_string()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-epochs", type=int, default=80)
    parser.add_argument("--trials", type=int, default=200)
    args = parser.parse_args()
    # the libraries first: they install their own log handlers on import, which library_logs_to replaces

    print(f"plansight demo (library logs: {LOG.relative_to(REPO)})")
    with library_logs_to(LOG):
        setup()
        _demo(args)


def _demo(args) -> None:
    ds = PlanGraphs()
    splits = named_splits(ds.meta)
    predictor = champion_or_train(ds, splits[SERVING_SPLIT], args.max_epochs)
    print("\n[2/3] accuracy on held-out measurements\n" + accuracy_table(ds, splits, predictor))
    request = SearchRequest.model_validate(
        {"workload": json.loads(SEARCH_WORKLOAD.read_text()), "cluster": {"preset": "a100-80gb"}, "trials": args.trials}
    )
    print(f"\n[3/3] plan search for a never-measured workload ({SEARCH_WORKLOAD.name}, 1 x 8 A100-80GB)")
    print_table(search(predictor, request, storage=None, progress=True), request.time_quantile)


if __name__ == "__main__":
    main()
