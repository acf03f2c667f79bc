"""Leave one source out: train without a whole source (one cluster and framework, or one public table), predict
every run of it, keep the residuals.

    python -m experiments.sources.loso [--sources playbook vtrain ...] [--members 3]

A user's cluster is never one we trained on. What the intervals should say there is learned from how wrong a model
is on a source it never saw (gnn.dataset.splits.source_splits: each GPU source with 20 timed runs), not from
validation rows drawn beside its training rows. Each source's model is trained once and kept under build/evaluate/
(keyed like experiments.evaluate's); its predictions of the held-out runs, with the interval calibrated in
distribution, go to experiments/results/loso_rows.csv, one line per run. experiments.sources.report reads them.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import pandas as pd
import torch
from tqdm import tqdm

from collect import REPO
from experiments.evaluate import model_path
from gnn.dataset.graphs import PlanGraphs
from gnn.dataset.splits import calibration_domain, source_of, source_splits
from gnn.inference.coverage import training_range
from gnn.inference.predictor import BatchPredictor
from gnn.predictors.registry import REGISTRY
from gnn.predictors.surrogate import TrainConfig, train_ensemble
from gnn.tracking.scoring import ensemble_frame

ROWS = REPO / "experiments" / "results" / "loso_rows.csv"
KEPT = ("run_id", "domain", "device_kind", "family", "num_params", "world_size", "nodes", "dp", "tp", "pp")
KEPT += ("micro_batch_size", "seq_len", "status", "iter_time_s", "peak_mem_bytes", "memory_bytes")


def held_out_rows(ds: PlanGraphs, split: str, parts: dict, cfg: TrainConfig) -> pd.DataFrame:
    """The held-out source's runs beside the predictions of a model trained without it (trained here, or loaded)."""
    path = model_path(ds, split, cfg, "loso")
    if path.exists():
        ensemble = BatchPredictor.load(path, ds.hardware_dir).ensemble
    else:
        ensemble = train_ensemble(ds, parts, cfg, progress=False, nested_checks=False)
        info = {"split": split, "trained_range": training_range(ds.meta.loc[parts["train"]])}
        path.parent.mkdir(parents=True, exist_ok=True)
        BatchPredictor(ensemble, ds.hardware_dir, info).save(path)
    idx = parts["test"]
    rows = ds.meta.loc[idx]
    domains, scored = rows["domain"].astype(str).tolist(), calibration_domain(rows).tolist()
    pred = ensemble.predict(ds[torch.as_tensor(idx)], domains=domains, calibrated_as=scored)
    kept = rows[[c for c in KEPT if c in rows]].copy()
    kept.insert(0, "source", source_of(rows))
    kept["rule_time_s"] = REGISTRY["rule_of_thumb"]().predict(rows)["pred_time_s"]  # the floor to clear by far
    return pd.concat([kept, ensemble_frame(pred, rows.index)], axis=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", nargs="*", help="hold out only these (default: every source with 20 timed runs)")
    parser.add_argument("--members", type=int, default=3, help="members per model (default 3: as the served ensemble)")
    parser.add_argument("--out", default=str(ROWS))
    args = parser.parse_args(argv)
    ds = PlanGraphs()
    splits = source_splits(ds.meta)
    names = {s.removeprefix("source/held_out-"): s for s in splits}
    unknown = sorted(set(args.sources or []) - set(names))
    if unknown:
        parser.error(f"--sources: unknown {unknown}; the sources are {sorted(names)}")
    chosen = [names[s] for s in (args.sources or sorted(names))]
    cfg = replace(TrainConfig(), members=args.members)
    frames = []
    for split in tqdm(chosen, desc="sources held out", unit="source"):
        frames.append(held_out_rows(ds, split, splits[split], cfg))
        pd.concat(frames).to_csv(args.out, index=False)  # after each source: a stopped run keeps what it finished
    print(f"{sum(map(len, frames))} held-out runs of {len(frames)} sources -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
