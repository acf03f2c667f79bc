"""Train the GNN surrogate ensemble on a named split, track it in MLflow, register it (champion if it is better).

    python -m gnn.train [--split all/random] [--members 3] [--max-epochs 80] [--no-physics] [--no-checks]
                        [--data DATA_ROOT] [--accelerator cpu|gpu --devices 2 --strategy ddp]

The default split, all/random, trains one model over the CPU runs and the A100
rows: the model that is served. Training itself is gnn.predictors.surrogate.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_only

from collect import REPO
from gnn.dataset.graphs import PlanGraphs
from gnn.dataset.splits import SERVING_SPLIT, named_splits
from gnn.inference.predictor import BatchPredictor
from gnn.predictors.surrogate import TrainConfig, calibrate_ensemble, train_ensemble
from gnn.tracking.model_cache import load_model
from gnn.tracking.runs import TrackingUnavailable, answering, log_surrogate, setup

# --strategy ddp is Lightning's "ddp": its launcher re-runs this same command line in N-1 child processes
# (LOCAL_RANK set) when the first member's fit starts, and every rank then runs main() to the end. Chosen over
# "ddp_spawn", which pickles the module and all graphs into fresh workers on every fit (each member, each gate
# member), and hands back only rank 0's last weights and best checkpoint path: not ModelCheckpoint's best score
# nor the epoch reached (fit reads both), nor anything the ranks computed. With "ddp" the children build nothing
# (the graph cache exists once rank 0 reaches fit), each process stays up for all members, and the same code runs
# under torchrun or SLURM, which start the ranks themselves (there all ranks would build a missing graph cache at
# once: build it first). The price: every rank runs main(), so what must happen once (MLflow, registering, the
# summary) is guarded by the global rank.
STRATEGIES = ("auto", "ddp")


def is_rank_zero() -> bool:
    """Global rank 0: from the process group once training started it; before that, from the environment the
    launcher set (Lightning's rank_zero_only reads RANK / LOCAL_RANK / SLURM_PROCID at import)."""
    return dist.get_rank() == 0 if dist.is_available() and dist.is_initialized() else rank_zero_only.rank == 0


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
        "--strategy",
        choices=STRATEGIES,
        default="auto",
        help="ddp: one process per device (gloo on CPU, nccl on GPUs), each with batch-size / devices graphs",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=REPO / "data",
        metavar="ROOT",
        help="a folder holding runs/*.parquet and hardware/ (its graph cache goes to ROOT/processed)",
    )
    parser.add_argument(
        "--no-checks",
        action="store_true",
        help="skip the two nested gate members (where the correction carries beyond the training range)",
    )
    parser.add_argument(
        "--recalibrate",
        metavar="MODEL_URI",
        help="re-fit the intervals of a trained model (e.g. models:/plansight@champion) and log it anew",
    )
    args = parser.parse_args()
    if is_rank_zero():  # before training, so that a tracking store that cannot be reached fails at once
        try:
            setup()
        except TrackingUnavailable as e:
            raise SystemExit(f"error: {e}: start it, or set MLFLOW_TRACKING_URI to one that runs") from None
    ds = PlanGraphs(root=args.data)
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
    trainer = {"accelerator": args.accelerator, "devices": args.devices, "strategy": args.strategy}
    start = time.perf_counter()
    ensemble = train_ensemble(ds, parts, cfg, progress=is_rank_zero(), nested_checks=not args.no_checks, **trainer)
    if not is_rank_zero():
        return  # every rank holds the same ensemble (gnn.predictors.surrogate checks it); rank 0 records it
    params = {**asdict(cfg), **trainer, "nested_checks": not args.no_checks}
    try:
        with answering():
            print(log_surrogate(ensemble, ds, parts, args.split, params, train_seconds=time.perf_counter() - start))
    except TrackingUnavailable as e:
        # an alias is moved only after its version is whole, so nothing half-registered is left behind; the
        # training itself is kept, to serve or log once the server is back
        kept = REPO / "build" / "unlogged" / f"{args.split.replace('/', '-')}-{time.strftime('%Y%m%dT%H%M%S')}.pt"
        kept.parent.mkdir(parents=True, exist_ok=True)
        BatchPredictor(ensemble, ds.hardware_dir, {"split": args.split, "params": params}).save(kept)
        raise SystemExit(
            f"error: {e}: the model was not logged and nothing was registered; it is kept in {kept} "
            "(serve it with --model PATH), and training again logs it once the server answers"
        ) from None


if __name__ == "__main__":
    main()
