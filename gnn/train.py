"""Train the GNN surrogate ensemble on a named split, track it in MLflow, register it if it is better.

    python -m gnn.train [--split all/random] [--members 3] [--max-epochs 80] [--no-physics]
                        [--accelerator gpu --devices 2]

The default split, all/random, trains one model over the CPU runs and the A100
rows: the model that is served. Training itself is gnn.predictors.surrogate.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict

from gnn.dataset.graphs import PlanGraphs
from gnn.dataset.splits import SERVING_SPLIT, named_splits
from gnn.predictors.surrogate import TrainConfig, calibrate_ensemble, train_ensemble
from gnn.tracking.model_cache import load_model
from gnn.tracking.runs import log_surrogate, setup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default=SERVING_SPLIT)
    parser.add_argument("--members", type=int, default=TrainConfig.members)
    parser.add_argument("--max-epochs", type=int, default=TrainConfig.max_epochs)
    parser.add_argument("--no-physics", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", default="1")
    parser.add_argument(
        "--recalibrate",
        metavar="MODEL_URI",
        help="re-fit the intervals of a trained model (e.g. models:/plansight@champion) and log it anew",
    )
    args = parser.parse_args()
    setup()
    ds = PlanGraphs()
    parts = named_splits(ds.meta)[args.split]
    if args.recalibrate:
        ensemble = load_model(args.recalibrate).ensemble
        calibrate_ensemble(ensemble, ds, parts)
        print(
            log_surrogate(
                ensemble, ds, parts, args.split, {"recalibrated_from": args.recalibrate}, 0.0, recalibrated=True
            )
        )
        return
    cfg = TrainConfig(max_epochs=args.max_epochs, physics=not args.no_physics, seed=args.seed, members=args.members)
    start = time.perf_counter()
    ensemble = train_ensemble(ds, parts, cfg, accelerator=args.accelerator, devices=args.devices)
    summary = log_surrogate(ensemble, ds, parts, args.split, asdict(cfg), train_seconds=time.perf_counter() - start)
    print(summary)


if __name__ == "__main__":
    main()
