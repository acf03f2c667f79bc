"""Evaluate the GNN and every baseline on every named split; print the table, write and log the records.

    python -m experiments.evaluate [--members 3] [--no-gnn] [--splits SPLIT ...] [--ablation-splits SPLIT ...]

Baselines are fit on a split's training and validation rows (they have no
hyper-parameters to select) and scored on its test rows, per hardware domain.
The GNN ensemble trains on the training rows, early-stops and calibrates its
intervals on the validation rows, and is scored on the same test rows. Its
random-split figures come from the served model's split, all/random, which
holds out exactly the test rows of cpu/random and a100/random. Two ablations,
each one member beside gnn_single (the ensemble's first member, the same seed
and config): gnn_no_physics masks the simulator's and analytical estimates
out; gnn_simulator_base corrects the raw simulator's time instead of the
fitted analytical model (gnn.model.physics_base), the served model's time base. gnn_mean: the
served ensemble's members combined by their mean instead of their median. GNN results are cached per split
under build/evaluate/, keyed on the data, the code and the config, so an interrupted run resumes.

Records: {predictor, domain, split, target (time | memory | oom | ranking), n,
mape, mdape, gmae, p90, max, coverage, ...}, plus the measured floor under each split's error: the noise
floor of each CPU split's test rows (predictor noise_floor: repeats of one plan), and on GPU splits the twin
floor (predictor twin_floor: runs that differ only between plain data parallel and ZeRO-1, which no predictor
can tell apart; collect.report).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from collect import REPO
from collect.report import noise_floor, twin_groups
from gnn.dataset.graphs import PlanGraphs
from gnn.dataset.sources import code_key
from gnn.dataset.splits import FAKE, SERVING_SPLIT, named_splits, scored_domain
from gnn.inference.coverage import training_range
from gnn.inference.predictor import BatchPredictor
from gnn.model.ensemble import DEFAULT_AGGREGATE, Ensemble
from gnn.predictors.registry import BASELINE_NAMES, REGISTRY
from gnn.predictors.surrogate import TrainConfig, calibrate_ensemble, gate, train_ensemble
from gnn.tracking.runs import setup
from gnn.tracking.scoring import ensemble_records, score

CACHE = REPO / "build" / "evaluate"


def evaluate_predictor(name: str, meta: pd.DataFrame, split: str, parts: dict) -> list[dict]:
    domain, split_name = split.split("/", 1)
    train = meta.loc[np.concatenate([parts["train"], parts["val"]])]
    test = meta.loc[parts["test"]]
    pred = REGISTRY[name]().fit(train).predict(test)
    base = {"predictor": name, "domain": domain, "split": split_name}
    return score(test, pred, base) + (per_family(test, pred, base) if split_name == "random" else [])


def per_family(test: pd.DataFrame, pred: pd.DataFrame, base: dict) -> list[dict]:
    """A random split's test rows of each model family scored alone, as split "random:<family>" (where the test
    rows hold more than one family)."""
    if test["family"].nunique() < 2:
        return []
    return [
        r
        for family, rows in test.groupby("family")
        for r in score(rows, pred.loc[rows.index], {**base, "split": f"{base['split']}:{family}"})
    ]


def gnn_splits(splits: dict) -> list[str]:
    """The splits the GNN trains on: the serving split stands for every domain's random split."""
    return [s for s in splits if not (s.endswith("/random") and s != SERVING_SPLIT)]


# ablations cost a single member each: by default on the random split and the splits that hold out whole shapes
ABLATION_SPLITS = ("all/random", "cpu/held_out_shape", "a100/held_out_hidden", "a100/held_out_layers")
# the splits whose test rows lie beyond the largest scale or model trained on, where the nested checks' verdicts
# act; elsewhere they would cost two members' training for nothing the test rows reach (the served model, trained
# by make train, always has them)
NESTED_SPLITS = ("h100/held_out_size", "h100/held_out_scale", "a100/held_out_scale")
SCORING = 10  # bump when calibration or scoring changes: records are then recomputed from the cached models


def model_path(ds: PlanGraphs, split: str, cfg: TrainConfig, name: str = "gnn") -> Path:
    """Where the ensemble trained on ``split`` with ``cfg`` is kept (keyed on the data, the graph code, cfg and the
    training code: every project module gnn.predictors.surrogate imports, the loss among them)."""
    code = code_key(["gnn.predictors.surrogate"])
    key = hashlib.sha256(json.dumps([ds.key, split, asdict(cfg), code], sort_keys=True).encode()).hexdigest()[:12]
    return CACHE / f"{name}-{split.replace('/', '-')}-{key}.pt"


def evaluate_gnn(ds: PlanGraphs, split: str, parts: dict, cfg: TrainConfig, name: str) -> list[dict]:
    """Records for the test rows of ``split``: from the cache, from the cached model, or from a new ensemble."""

    model = model_path(ds, split, cfg, name)
    cached = model.with_name(model.stem + f".records-v{SCORING}.json")
    if cached.exists():
        return json.loads(cached.read_text())
    gates = model.with_name(model.stem + ".gates.json")  # the nested checks' verdicts: members' training time
    if model.exists():
        ensemble = BatchPredictor.load(model, ds.hardware_dir, recalibrate=True).ensemble
        ensemble.aggregate = DEFAULT_AGGREGATE  # how members combine, like calibration, is post hoc: the current code's
        calibrate_ensemble(ensemble, ds, parts)  # calibration is post hoc: redo it with the current code
        if gates.exists():
            ensemble.keeps_correction.copy_(torch.tensor(json.loads(gates.read_text())))
        elif len(ensemble.members) > 1 and split in NESTED_SPLITS:
            gate(ensemble, ds, parts, cfg)
    else:
        nested = cfg.members > 1 and split in NESTED_SPLITS
        ensemble = train_ensemble(ds, parts, cfg, progress=False, nested_checks=nested)
    if split in NESTED_SPLITS and len(ensemble.members) > 1:  # only verdicts the checks gave, not the defaults
        gates.parent.mkdir(parents=True, exist_ok=True)
        gates.write_text(json.dumps(ensemble.keeps_correction.tolist()))
    CACHE.mkdir(parents=True, exist_ok=True)
    # the model is kept: experiments/search_proof.py searches with the model that never saw the held-out shape
    info = {"split": split, "config": asdict(cfg), "trained_range": training_range(ds.meta.loc[parts["train"]])}
    BatchPredictor(ensemble, ds.hardware_dir, info).save(model)
    records, frames = ensemble_records(ensemble, ds, parts, split, predictor=name, which=("test",))
    if len(ensemble.members) > 1:
        # its first member alone (seed 0) is a single model: the like-for-like partner of a one-member ablation;
        # and the same members combined by their mean instead of their median
        single, mean = Ensemble([ensemble.members[0]]), Ensemble(list(ensemble.members), aggregate="mean")
        for variant, suffix in ((single, "single"), (mean, "mean")):
            calibrate_ensemble(variant, ds, parts)
            variant.keeps_correction.copy_(ensemble.keeps_correction)
            records += ensemble_records(variant, ds, parts, split, predictor=f"{name}_{suffix}", which=("test",))[0]
    for r in records:
        r.pop("part")
        if split == SERVING_SPLIT:
            r["split"] = "random"
    if split == SERVING_SPLIT:
        rows, pred = frames["test"]
        for domain, group in rows.groupby(scored_domain(rows)):
            base = {"predictor": name, "domain": domain, "split": "random"}
            records += per_family(group, pred.loc[group.index], base)
    cached.write_text(json.dumps(records))
    return records


MIN_TWINS = 10  # a twin floor over fewer runs is a handful of plans, too few to show


def noise_records(meta: pd.DataFrame, splits: dict) -> list[dict]:
    """The floor under each split's error: on CPU splits, how far repeats of one plan differ (time and memory);
    on GPU splits, whose runs are never repeated, how far twins differ (collect.report.twin_groups; time only,
    as ZeRO-1 does change memory)."""
    records = []
    for split, parts in splits.items():
        domain, name = split.split("/", 1)
        test = meta.loc[parts["test"]]
        if domain == "cpu" and test["repeat_group"].notna().any():
            # memory is not exact either: FSDP's peaks move with when gloo's asynchronous collectives free buffers
            for target, column in (("time", "iter_time_s"), ("memory", "peak_mem_bytes")):
                records.append(_floor_record("noise_floor", noise_floor(test, column), domain, name, target))
        elif domain not in ("cpu", "all", FAKE):  # a fake trace has no time to have twins in
            floor = noise_floor(test.assign(twin_group=twin_groups(test)), "iter_time_s", "twin_group")
            if floor["measurements"].iloc[0] >= MIN_TWINS:
                records.append(_floor_record("twin_floor", floor, domain, name, "time"))
    return records


def _floor_record(predictor: str, floor: pd.DataFrame, domain: str, split: str, target: str) -> dict:
    overall = floor.iloc[0]
    return {
        "predictor": predictor,
        "domain": domain,
        "split": split,
        "target": target,
        "n": int(overall["measurements"]),
        "mape": float(overall["mean_rel_dev"]),
        "mdape": float(overall["median_rel_dev"]),
    }


FULL_COLUMNS = ("n", "mape", "mdape", "gmae", "bias", "p90", "max", "coverage", "accuracy", "precision", "recall")
FULL_COLUMNS += ("kendall_tau", "top1_success", "regret")


def table(records: list[dict]) -> str:
    df = pd.DataFrame(records)
    errors = df[df.target.isin(["time", "memory"])]
    lines = [
        "MAPE % on test rows (noise_floor: mean relative deviation of repeated measurements of one plan; twin_floor:"
        " of twin runs, DDP and ZeRO-1 of one plan)",
        (
            errors.pivot_table(index=["domain", "split", "target"], columns="predictor", values="mape", aggfunc="first")
            * 100
        )
        .round(1)
        .to_string(),
        "",
        "median APE % (noise_floor, twin_floor: median relative deviation)",
        (
            errors.pivot_table(
                index=["domain", "split", "target"], columns="predictor", values="mdape", aggfunc="first"
            )
            * 100
        )
        .round(1)
        .to_string(),
    ]
    gnn = df[df.predictor == "gnn"]
    if len(gnn):
        cols = [c for c in FULL_COLUMNS if c in gnn]
        lines += [
            "",
            "GNN in full (coverage: share of measurements inside the 80% interval)",
            gnn.set_index(["domain", "split", "target"])[cols].sort_index().round(3).to_string(),
        ]
    for col, title in (
        ("bias", "bias (geometric mean of predicted / measured)"),
        ("coverage", "80% interval coverage"),
    ):
        if col in errors:
            pivot = errors.pivot_table(index=["domain", "split", "target"], columns="predictor", values=col)
            lines += ["", f"{title} on test rows", pivot.round(3).dropna(how="all").to_string()]
    extra = df[df.target.isin(["oom", "ranking"])]
    cols = [c for c in ("accuracy", "recall", "kendall_tau", "top1_success", "regret", "median_regret") if c in extra]
    for col in cols:
        table = extra.pivot_table(index=["domain", "split"], columns="predictor", values=col, aggfunc="first")
        lines += ["", f"{col} (test rows)", table.round(3).dropna(how="all").to_string()]
    return "\n".join(lines)


def log_to_mlflow(records: list[dict], text: str, out: Path) -> None:
    setup()
    with mlflow.start_run(run_name="evaluate"):
        for r in records:
            if r.get("mape") is not None and r["target"] in ("time", "memory"):
                mlflow.log_metric(f"{r['predictor']}_{r['domain']}_{r['split']}_{r['target']}_mape", r["mape"])
        mlflow.log_artifact(str(out))
        mlflow.log_text(text, "evaluation.txt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "evaluation.json"))
    parser.add_argument("--members", type=int, default=TrainConfig.members)
    parser.add_argument("--max-epochs", type=int, default=TrainConfig.max_epochs)
    parser.add_argument("--no-gnn", action="store_true", help="baselines only (seconds instead of tens of minutes)")
    parser.add_argument(
        "--ablation-splits",
        nargs="*",
        default=list(ABLATION_SPLITS),
        help="splits for the ablations, or 'all' (default: the random split and whole held-out shapes)",
    )
    parser.add_argument(
        "--splits", nargs="*", help="evaluate only these splits (e.g. all/random cpu/held_out_moe; default: every one)"
    )
    args = parser.parse_args()

    ds = PlanGraphs()
    splits = named_splits(ds.meta)
    if args.splits:
        unknown = sorted(set(args.splits) - set(splits))
        if unknown:
            parser.error(f"--splits: unknown {unknown}; the splits are {sorted(splits)}")
        splits = {name: parts for name, parts in splits.items() if name in args.splits}
    records = noise_records(ds.meta, splits)
    for split, parts in splits.items():
        if split != SERVING_SPLIT:
            records += [r for name in BASELINE_NAMES for r in evaluate_predictor(name, ds.meta, split, parts)]
    cfg = replace(TrainConfig(), members=args.members, max_epochs=args.max_epochs)
    # ablations are single members beside gnn_single (the ensemble's first member: same seed, config, physics):
    # without physics inputs, and with the raw simulator as the time base instead of the fitted analytical model
    ablations = [
        ("gnn_no_physics", replace(cfg, physics=False, members=1)),
        ("gnn_simulator_base", replace(cfg, time_base="simulator", members=1)),
    ]
    trained = gnn_splits(splits)
    jobs = [] if args.no_gnn else [("gnn", cfg, split) for split in trained]
    ablated = trained if args.ablation_splits == ["all"] else [s for s in args.ablation_splits if s in splits]
    jobs += [] if args.no_gnn else [(name, c, split) for name, c in ablations for split in ablated]
    for name, c, split in tqdm(jobs, desc="GNN ensembles", unit="split"):
        records += evaluate_gnn(ds, split, splits[split], c, name)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1))
    text = table(records)
    out.with_suffix(".txt").write_text(text + "\n")
    log_to_mlflow(records, text, out)
    print(text)
    print(f"\nwrote {len(records)} records to {out} and {out.with_suffix('.txt')}; logged to MLflow")


if __name__ == "__main__":
    main()
