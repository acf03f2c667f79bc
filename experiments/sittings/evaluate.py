"""cpu/held_out_sitting: each sitting of the fixed plan set held out in turn, with 0, 3 and 10 probe runs.

For each sitting (a cpu-sitting-* sweep): an ensemble trained on every other row (the split of
gnn.dataset.splits, the same model make evaluate trains and caches), its predictions of the sitting's plans, and
the same predictions corrected by the first K of the probe's plans as that sitting measured them
(gnn.inference.probe). The probe's ten plans are left out of the scored rows whatever K, so every K is scored on
the same rows, beside the sitting's own noise floor (its repeats). The champion as it was before sittings
existed, when it loads, is scored on the same rows as the "before".

    python -m experiments.sittings.evaluate [--members 3]   # experiments/results/sittings_eval.{json,txt}
    python -m experiments.sittings.evaluate --model URI --sweeps SWEEP... --probe PROBE --out judged.json
                                        # any model on a sitting of one's own (plans it never saw, the probe
                                        # taken in that sitting: python -m collect probe)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from collect import REPO
from collect.report import noise_floor
from collect.sweep import SweepSpec
from experiments.evaluate import model_path
from gnn.dataset.graphs import PlanGraphs
from gnn.dataset.rows import load_runs
from gnn.dataset.splits import named_splits
from gnn.inference.coverage import training_range
from gnn.inference.predictor import BatchPredictor
from gnn.inference.probe import fit_correction, load_probe
from gnn.predictors.surrogate import TrainConfig, calibrate_ensemble, train_ensemble
from gnn.tracking.model_cache import load_model
from gnn.tracking.scoring import score

PROBES = (0, 3, 10)
PROBE_SPEC = REPO / "collect" / "sweeps" / "probe-cpu.yaml"
OUT = REPO / "experiments" / "results" / "sittings_eval.json"
PRED_COLUMNS = {"iter_time_s": "pred_time_s", "iter_time_lo_s": "pred_time_lo_s", "iter_time_hi_s": "pred_time_hi_s",
                "peak_mem_bytes": "pred_mem_bytes", "peak_mem_lo_bytes": "pred_mem_lo_bytes",
                "peak_mem_hi_bytes": "pred_mem_hi_bytes"}  # fmt: skip


def probe_ids() -> list[str]:
    return [p.run_id for p in SweepSpec.from_yaml(PROBE_SPEC).points]


def fold_predictor(ds: PlanGraphs, split: str, parts: dict, cfg: TrainConfig) -> BatchPredictor:
    """The split's ensemble from make evaluate's cache, calibrated by the current code, or trained and cached."""
    path = model_path(ds, split, cfg)
    if path.exists():
        predictor = BatchPredictor.load(path, ds.hardware_dir, recalibrate=True)
        calibrate_ensemble(predictor.ensemble, ds, parts)
        return predictor
    ensemble = train_ensemble(ds, parts, cfg, progress=True, nested_checks=False)
    info = {"split": split, "trained_range": training_range(ds.meta.loc[parts["train"]])}
    predictor = BatchPredictor(ensemble, ds.hardware_dir, info)
    path.parent.mkdir(parents=True, exist_ok=True)
    predictor.save(path)
    return predictor


def probe_rows_of(rows: pd.DataFrame, probes: list[str]) -> pd.DataFrame:
    """A sitting's own measurements of the probe's plans (the first of each), in the probe's order."""
    measured = rows[rows["run_id"].isin(probes)].drop_duplicates("run_id").set_index("run_id")
    return measured.loc[[p for p in probes if p in measured.index]].reset_index()


def sitting_records(
    predictor: BatchPredictor, test: pd.DataFrame, probe_rows: pd.DataFrame, base: dict, floor_rows: pd.DataFrame
) -> list[dict]:
    """Scores of ``test`` with the first K probe rows for each K of PROBES (as many as there are), beside the
    noise floor of ``floor_rows`` (the sitting's repeats)."""
    raw = predictor.predict_rows(test)
    floor = noise_floor(floor_rows).set_index("subset")
    floor = floor.loc["all"] if "all" in floor.index and floor.loc["all", "groups"] else {}
    records = []
    for k in [k for k in PROBES if k <= len(probe_rows)]:
        columns = {c: raw[c].to_numpy() for c in PRED_COLUMNS}
        extra = {"floor_mean": floor.get("mean_rel_dev"), "floor_median": floor.get("median_rel_dev")}
        if k:
            correction = fit_correction(predictor, probe_rows.head(k), f"probe{k}")
            columns = correction.apply(columns, test["world_size"].to_numpy())
            shift, sd = correction.shift(test["world_size"].to_numpy())
            extra |= {"time_factor": float(np.exp(np.median(shift))), "log_sd": float(np.median(sd))}
        pred = pd.DataFrame({PRED_COLUMNS[c]: v for c, v in columns.items()}, index=test.index)
        records += [r | extra for r in score(test, pred, {**base, "probe_runs": k})]
    return records


def judge(model: str, sweeps: list[str], probe: str | None) -> list[dict]:
    """Score a model on sweeps measured in one sitting (plans it may never have seen), with the probe taken in the
    same sitting: what anyone checking the claim runs, e.g. on a fresh sitting of their own."""
    predictor = load_model(model)
    rows = load_runs([REPO / "data" / "runs" / f"{s}.parquet" for s in sweeps])
    rows = rows[rows["status"] == "ok"]
    probe_rows = load_probe(probe) if probe else rows.iloc[:0]
    base = {"domain": "cpu", "split": "+".join(sweeps), "predictor": "gnn"}
    return sitting_records(predictor, rows, probe_rows, base, rows)


def before_records(model: str, test: pd.DataFrame, base: dict) -> list[dict]:
    """The served model as it was before sittings existed, on the same rows, without a probe (when it loads)."""
    try:
        predictor = load_model(model)
    except Exception as e:  # noqa: BLE001 - an old or absent model only loses the "before" column
        print(f"before: {model}: {e}")
        return []
    raw = predictor.predict_rows(test)
    pred = pd.DataFrame({PRED_COLUMNS[c]: raw[c].to_numpy() for c in PRED_COLUMNS}, index=test.index)
    return [r | {"probe_runs": 0} for r in score(test, pred, {**base, "predictor": "before", "probe_runs": 0})]


def table(records: list[dict]) -> str:
    lines = ["| sitting | predictor | probe runs | time MAPE | median APE | bias | 80% holds | floor mean / median "
             "| memory MAPE | fits |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    df = pd.DataFrame(records)
    for (split, predictor, k), g in df.groupby(["split", "predictor", "probe_runs"], sort=True):
        t = g[g.target == "time"].iloc[0]
        m = g[g.target == "memory"].iloc[0] if (g.target == "memory").any() else {}
        o = g[g.target == "oom"].iloc[0] if (g.target == "oom").any() else {}
        floor = f"{100 * t.get('floor_mean', np.nan):.1f} / {100 * t.get('floor_median', np.nan):.1f}"
        lines.append(
            f"| {split.removeprefix('held_out_sitting-')} | {predictor} | {k} | {100 * t['mape']:.1f} | "
            f"{100 * t['mdape']:.1f} | {t['bias']:.2f} | {100 * (t.get('coverage') or np.nan):.0f}% | {floor} | "
            f"{100 * m.get('mape', np.nan):.1f} | {o.get('accuracy', np.nan):.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=TrainConfig.members)
    parser.add_argument(
        "--before",
        default=None,
        help="a model URI or predictor.pt to score as the 'before' (e.g. models:/plansight@champion)",
    )
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--model", default=None, help="judge this model (URI or .pt) on --sweeps instead")
    parser.add_argument("--sweeps", nargs="*", default=[], help="with --model: sweeps of one sitting to score")
    parser.add_argument("--probe", default=None, help="with --model: the probe taken in that sitting")
    args = parser.parse_args()
    if args.model:
        if not args.sweeps:
            parser.error("--model needs --sweeps: the sitting's sweeps in data/runs")
        return report(judge(args.model, args.sweeps, args.probe), Path(args.out))
    ds = PlanGraphs()
    splits = {s: p for s, p in named_splits(ds.meta).items() if s.startswith("cpu/held_out_sitting")}
    if not splits:
        raise SystemExit(
            "no sittings in data/runs: python -m collect sweep collect/sweeps/cpu-sittings.yaml --name ..."
        )
    cfg = replace(TrainConfig(), members=args.members)
    probes, records = probe_ids(), []
    for split, parts in splits.items():
        rows = ds.meta.loc[parts["test"]]
        base = {"domain": "cpu", "split": split.split("/", 1)[1]}
        predictor = fold_predictor(ds, split, parts, cfg)
        test = rows[~rows["run_id"].isin(probes)]  # every K scored on the same rows
        first = rows[rows["sweep_id"] == rows["sweep_id"].min()]  # the sitting's first sweep: its probe and repeats
        records += sitting_records(predictor, test, probe_rows_of(first, probes), {**base, "predictor": "gnn"}, first)
        if args.before:
            records += before_records(args.before, test, base)
        records += lookup_records(ds.meta.loc[np.concatenate([parts["train"], parts["val"]])], test, base)
    report(records, Path(args.out))


def lookup_records(trained: pd.DataFrame, test: pd.DataFrame, base: dict) -> list[dict]:
    """The same plans' median time and peak over every other sitting that measured them: what remembering each
    plan would give, so the error a relaunch of the machine alone leaves (no model can do better on average)."""
    ok = trained[trained["status"] == "ok"].groupby("run_id")[["iter_time_s", "peak_mem_bytes"]].median()
    known = test[test["run_id"].isin(ok.index)]
    pred = pd.DataFrame(
        {"pred_time_s": ok.loc[known["run_id"], "iter_time_s"].to_numpy(),
         "pred_mem_bytes": ok.loc[known["run_id"], "peak_mem_bytes"].to_numpy()},
        index=known.index,
    )  # fmt: skip
    return [r | {"probe_runs": 0} for r in score(known, pred, {**base, "predictor": "lookup", "probe_runs": 0})]


def report(records: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1, default=float))
    text = table(records)
    out.with_suffix(".txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
