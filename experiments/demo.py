"""The main job end to end on the embedded default.

    python -m experiments.demo        (make demo)

Until the surrogate lands this runs the default local sweep
(collect/sweeps/default.yaml: CPU, gloo, a few minutes) into build/demo/ and
prints its results table, so a fresh clone shows real measurements at once.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from collect.run import SweepRunner
from collect.sweep import SweepSpec

DEFAULT_SWEEP = Path(__file__).resolve().parents[1] / "collect" / "sweeps" / "default.yaml"
COLUMNS = ["world_size", "dp", "tp", "pp", "sharding", "recompute", "pp_schedule", "num_microbatches",
           "layers", "hidden", "status", "iter_time_ms", "peak_mib", "capacity_mib"]


def results_table(df: pd.DataFrame) -> str:
    df = df[~df["is_reference"]].copy()
    df["iter_time_ms"] = (df["iter_time_s"] * 1e3).round(1)
    df["peak_mib"] = (df["peak_mem_bytes"] / 2**20).round(2)
    df["capacity_mib"] = (df["memory_bytes"] / 2**20).round(0)
    df["pp_schedule"] = df["pp_schedule"].fillna("-")
    return df.sort_values(["world_size", "iter_time_ms"])[COLUMNS].to_string(index=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", default=str(DEFAULT_SWEEP))
    parser.add_argument("--out", default="build/demo")
    args = parser.parse_args()
    spec = SweepSpec.from_yaml(args.sweep)
    runner = SweepRunner(spec, out_dir=Path(args.out) / "runs", hardware_dir=Path(args.out) / "hardware")
    runner.run()
    print(results_table(runner.store.load()))


if __name__ == "__main__":
    main()
