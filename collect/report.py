"""Summarise measured runs: counts by world size and strategy, hours, noise floor.

    python -m collect.report data/runs/cpu-v1.parquet [--markdown]

Noise floor: for every repeat group (one plan measured >= 2 times at different
times in the sweep, status ok), each measurement's relative deviation from the
group's median iteration time; the floor is the median of those deviations,
overall and by world size. With three repeats one of them is the median
itself (deviation 0), as the definition counts it; the mean is shown beside.
"""

from __future__ import annotations

import argparse

import pandas as pd

from collect.store import ResultStore


def noise_floor(df: pd.DataFrame, column: str = "iter_time_s") -> pd.DataFrame:
    ok = df[(df["status"] == "ok") & df["repeat_group"].notna()].copy()
    ok["group_median"] = ok.groupby("repeat_group")[column].transform("median")
    ok["group_size"] = ok.groupby("repeat_group")[column].transform("size")
    ok = ok[ok["group_size"] >= 2]
    ok["rel_dev"] = (ok[column] - ok["group_median"]).abs() / ok["group_median"]
    rows = [("all", ok)] + [(f"world_size={ws}", g) for ws, g in ok.groupby("world_size")]
    return pd.DataFrame(
        [
            {
                "subset": name,
                "groups": g["repeat_group"].nunique(),
                "measurements": len(g),
                "median_rel_dev": g["rel_dev"].median(),
                "mean_rel_dev": g["rel_dev"].mean(),
            }
            for name, g in rows
        ]
    )


def counts(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    plans = df[~df["is_reference"].astype(bool)]
    layout = plans["pp"].astype(str) + "x" + plans["dp"].astype(str) + "x" + plans["tp"].astype(str)
    return {
        "status by world size": pd.crosstab(plans["world_size"], plans["status"], margins=True),
        "layout (pp x dp x tp)": pd.crosstab(layout, plans["status"], margins=True),
        "sharding": pd.crosstab(plans["sharding"], plans["world_size"], margins=True),
        "recompute": pd.crosstab(plans["recompute"], plans["world_size"], margins=True),
        "pp_schedule": pd.crosstab(plans["pp_schedule"].fillna("- (pp=1)"), plans["world_size"], margins=True),
        "num_microbatches": pd.crosstab(plans["num_microbatches"], plans["world_size"], margins=True),
        "shape (params)": pd.crosstab(plans["num_params"], plans["world_size"], margins=True),
        "capacity (MiB)": pd.crosstab(plans["memory_bytes"] // 2**20, plans["status"], margins=True),
    }


def drift(df: pd.DataFrame) -> pd.DataFrame:
    refs = df[df["is_reference"].astype(bool) & (df["status"] == "ok")]
    return refs.groupby("world_size")["iter_time_s"].agg(["count", "min", "median", "max"])


def hours(df: pd.DataFrame) -> tuple[float, float]:
    """(sum of per-plan wall time, first-to-last span) in hours."""
    stamps = pd.to_datetime(df["collected_at"].dropna())
    span = (stamps.max() - stamps.min()).total_seconds() / 3600 if len(stamps) else 0.0
    return df["wall_s"].sum() / 3600, span


def render(df: pd.DataFrame, markdown: bool) -> str:
    fmt = (lambda t: t.to_markdown()) if markdown else (lambda t: t.to_string())
    busy, span = hours(df)
    parts = [
        f"rows: {len(df)} ({(~df['is_reference'].astype(bool)).sum()} plans + "
        f"{df['is_reference'].astype(bool).sum()} reference), measuring {busy:.2f} h over {span:.2f} h"
    ]
    for title, table in counts(df).items():
        parts += [f"\n{title}\n", fmt(table)]
    for column, label in (("iter_time_s", "iteration time"), ("peak_mem_bytes", "peak memory")):
        parts += [
            f"\nnoise floor of {label} (relative deviation of repeats from their group median)\n",
            fmt(noise_floor(df, column).round(4).set_index("subset")),
        ]
    parts += ["\nreference plan iteration time (s) by world size (drift)\n", fmt(drift(df).round(4))]
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    print(render(ResultStore(args.path).load(), args.markdown))


if __name__ == "__main__":
    main()
