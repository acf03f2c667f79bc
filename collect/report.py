"""Summarise measured runs: counts by world size and strategy, hours, noise floor, twin floor.

    python -m collect.report data/runs/cpu-v1.parquet [--markdown]

Noise floor: for every repeat group (one plan measured >= 2 times at different
times in the sweep, status ok), each measurement's relative deviation from the
group's median iteration time; the floor is the median of those deviations,
overall and by world size. With three repeats one of them is the median
itself (deviation 0), as the definition counts it; the mean is shown beside.

Twin floor, for measurements never repeated (published tables): the same
deviations over twin groups instead, runs of one workload, plan and cluster
that differ only between plain data parallel and ZeRO-1. The two move the same
bytes per step (ZeRO-1's reduce-scatter and all-gather are a ring all-reduce's
two halves) and do the same compute but the optimizer step ZeRO-1 shards, a few
milliseconds on a GPU, so a predictor cannot tell their times apart there; how
far twins' measured times differ is a floor under its error. GPU runs only: on
a CPU the optimizer step is a real part of the iteration.
"""

from __future__ import annotations

import argparse

import pandas as pd

from collect.schema import Cluster, Plan, Workload
from collect.store import ResultStore

TWIN_SHARDINGS = frozenset({"none", "zero1"})


def noise_floor(df: pd.DataFrame, column: str = "iter_time_s", group: str = "repeat_group") -> pd.DataFrame:
    """Relative deviation of each finished run from its group's median, over groups of >= 2 (``group``: the
    column naming each run's group; repeat_group, or twin_group from twin_groups)."""
    ok = df[(df["status"] == "ok") & df[group].notna()].copy()
    ok["group_median"] = ok.groupby(group)[column].transform("median")
    ok["group_size"] = ok.groupby(group)[column].transform("size")
    ok = ok[ok["group_size"] >= 2]
    ok["rel_dev"] = (ok[column] - ok["group_median"]).abs() / ok["group_median"]
    rows = [("all", ok)] + [(f"world_size={ws}", g) for ws, g in ok.groupby("world_size")]
    return pd.DataFrame(
        [
            {
                "subset": name,
                "groups": g[group].nunique(),
                "measurements": len(g),
                "median_rel_dev": g["rel_dev"].median(),
                "mean_rel_dev": g["rel_dev"].mean(),
            }
            for name, g in rows
        ]
    )


def twin_groups(df: pd.DataFrame) -> pd.Series:
    """Each finished run's twin group (module docstring): a key of every workload, plan and cluster field but the
    sharding, kept where the group holds both plain data parallel and ZeRO-1 (and no other sharding); NaN for the
    rest."""
    fields = [*Workload.model_fields, *Plan.model_fields, *Cluster.model_fields]
    columns = [c for c in dict.fromkeys(fields) if c in df and c != "sharding"]
    ok = df[(df["status"] == "ok") & (df["device"] == "cuda") & df["sharding"].isin(TWIN_SHARDINGS)]
    key = pd.util.hash_pandas_object(ok[columns], index=False)
    shardings = ok.groupby(key)["sharding"].agg(frozenset)
    twins = key[key.isin(shardings.index[[s == TWIN_SHARDINGS for s in shardings]])]
    return twins.map(str).reindex(df.index)


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
    """(sum of per-plan wall time, first-to-last span) in hours; 0 for rows converted from published tables,
    which record neither."""
    stamps = pd.to_datetime(df["collected_at"].dropna()) if "collected_at" in df else pd.Series([])
    span = (stamps.max() - stamps.min()).total_seconds() / 3600 if len(stamps) else 0.0
    return (df["wall_s"].sum() if "wall_s" in df else 0.0) / 3600, span


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
    twins = df.assign(twin_group=twin_groups(df))
    if twins["twin_group"].notna().any():
        parts += [
            "\ntwin floor of iteration time (relative deviation of DDP / ZeRO-1 twins from their pair's median)\n",
            fmt(noise_floor(twins, "iter_time_s", "twin_group").round(4).set_index("subset")),
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
