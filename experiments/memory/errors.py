"""Where the peak-memory error comes from, per strategy: the simulator's on every CPU row, the served model's on
the cpu/random test rows, and the noise of the measurement itself.

    python -m experiments.memory.errors [--model models:/plansight@champion]

Memory goals are in the 2% range, and the error is not spread evenly: this groups it by sharding, by whether
data parallelism is on (dp > 1) and by pipeline depth, and puts beside each sharding the spread of repeated
measurements of one plan (collect.report.noise_floor). The simulator is fitted to nothing, so all CPU rows
are fair for it; the model only on its test rows. Writes experiments/results/memory_errors.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from collect import REPO
from collect.report import noise_floor
from collect.schema import DTYPE_BYTES
from gnn.dataset.graphs import PlanGraphs
from gnn.dataset.splits import named_splits
from serve.api import load_predictor

GROUPS = ["sharding", "data_parallel", "pp"]


def _errors(rows: pd.DataFrame, predicted: pd.Series) -> pd.Series:
    return predicted / rows["peak_mem_bytes"] - 1


def _table(rows: pd.DataFrame, error: pd.Series) -> pd.DataFrame:
    """MAPE and bias per group, and the median bytes missing (measured - predicted) as a share of one
    unsharded copy of a rank's parameters: what size of thing the prediction leaves out."""
    params = rows["num_params"] * rows["dtype"].map(DTYPE_BYTES).fillna(2) / (rows["tp"] * rows["pp"])
    missing = -error / (1 + error) * rows["peak_mem_bytes"] / params
    frame = rows.assign(error=error, missing=missing, data_parallel=rows["dp"] > 1)
    return (
        frame.groupby(GROUPS)
        .agg(
            rows=("error", "size"),
            mape=("error", lambda e: e.abs().mean()),
            bias=("error", "mean"),
            missing_over_params=("missing", "median"),
        )
        .reset_index()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models:/plansight@champion")
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "memory_errors.json"))
    args = parser.parse_args()

    dataset = PlanGraphs()
    meta = dataset.meta
    measured = meta[(meta["domain"] == "cpu") & (meta["status"] == "ok") & meta["peak_mem_bytes"].notna()]
    simulator = _table(measured, _errors(measured, measured["sim_mem_bytes"]))
    test = meta.iloc[named_splits(meta)["cpu/random"]["test"]]
    test = test[test.index.isin(measured.index)]
    predictor = load_predictor(args.model)
    # the rows' fingerprints are in this repository; a registered model carries only those it was trained with
    predictor.hardware_dir = dataset.hardware_dir
    predicted = predictor.predict_rows(test)["peak_mem_bytes"]
    model = _table(test, _errors(test, predicted.loc[test.index]))
    noise = pd.DataFrame(
        [
            {"sharding": s, **noise_floor(g, "peak_mem_bytes").iloc[0].to_dict()}
            for s, g in meta[meta["domain"] == "cpu"].groupby("sharding")
        ]
    )
    report = {
        "simulator_all_cpu_rows": simulator.to_dict("records"),
        "model_cpu_random_test": model.to_dict("records"),
        "measurement_noise_by_sharding": noise.to_dict("records"),
    }
    Path(args.out).write_text(json.dumps(report, indent=1, default=float))
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        for title, table in (
            ("simulator, every measured CPU row", simulator),
            ("served model, cpu/random test rows", model),
            ("measured peak memory, repeats of one plan", noise),
        ):
            print(f"\n{title}\n{table.to_string(index=False)}")


if __name__ == "__main__":
    main()
