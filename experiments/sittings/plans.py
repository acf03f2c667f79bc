"""The fixed plan set measured in every sitting of the CPU machine (collect/sweeps/cpu-sittings.yaml).

Drawn from plans the current protocol (counting allocator, pinned ranks, one warm-up and 5 timed steps)
already measured in cpu-v3 (2026-11-24 morning) and active-cpu / active-cpu-random (that evening), so
those sweeps are earlier sittings of the same plans, on other days. Per (family, world size) the same
number of plans, seeded, among those that took at most MAX_WALL_S to measure, so that one sitting fits
in about ten minutes of the 2-core machine.

    python -m experiments.sittings.plans   # rewrites collect/sweeps/cpu-sittings.yaml
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml

from gnn.dataset.rows import row_to_spec

EARLIER = ("cpu-v3", "active-cpu", "active-cpu-random")
PER_CELL = 18  # x 3 families x 3 world sizes = 162 plans
MAX_WALL_S = 6.0
SEED = 41
OUT = Path("collect/sweeps/cpu-sittings.yaml")
PROBE_OUT = Path("collect/sweeps/probe-cpu.yaml")
# the probe's plans in order (collect.probe runs the first K): every prefix of three covers world sizes 1, 2, 4 and
# the three families, so that K = 3 sees each world size's collectives and core sharing once
PROBE_CELLS = ((1, "llama"), (2, "moe"), (4, "gpt"), (1, "moe"), (2, "gpt"), (4, "llama"),
               (1, "gpt"), (2, "llama"), (4, "moe"), (2, "moe"))  # fmt: skip

MEASURE = {"warmup_iters": 1, "timed_iters": 5, "memory_window_iters": 2, "pin_cores": True}  # cpu-v3's protocol
PROBE_HEADER = """\
# The CPU probe's plans, in the order collect.probe takes them (python -m collect probe --k K runs the first K):
# ten plans of collect/sweeps/cpu-sittings.yaml, each at the median time of its (world size, family) cell in the
# earlier sittings. Written by `python -m experiments.sittings.plans`.
"""
HEADER = """\
# One fixed set of 162 plans (gpt, llama, moe x world sizes 1, 2, 4; 18 each), measured in several sittings
# of the same 2-core machine, each with a fresh fingerprint, to learn and test how a new sitting moves the
# times (cpu/held_out_sitting). Written by `python -m experiments.sittings.plans` from plans cpu-v3 and
# active-cpu(-random) measured on 2026-11-24, which are earlier sittings of them. Run a sitting with
#   python -m collect sweep collect/sweeps/cpu-sittings.yaml --name cpu-sitting-<YYYYMMDD>-<a|b|c>
"""


def earlier_rows(runs: Path = Path("data/runs")) -> pd.DataFrame:
    rows = pd.concat([pd.read_parquet(runs / f"{name}.parquet") for name in EARLIER], ignore_index=True)
    ok = (rows.status == "ok") & ~rows.is_reference.fillna(False).astype(bool)
    return rows[ok & (rows.peak_mem_method == "counting-allocator")]


def choose(rows: pd.DataFrame) -> pd.DataFrame:
    plans = (
        rows.groupby("run_id")
        .agg(family=("family", "first"), world_size=("world_size", "first"), wall_s=("wall_s", "median"))
        .reset_index()
    )
    plans = plans[plans.wall_s <= MAX_WALL_S]
    picked = plans.groupby(["family", "world_size"]).sample(n=PER_CELL, random_state=SEED)
    return rows[rows.run_id.isin(picked.run_id)].drop_duplicates("run_id")


def points(rows: pd.DataFrame, keep_order: bool = False) -> list[dict]:
    out = []
    for _, row in (rows if keep_order else rows.sort_values(["family", "world_size", "run_id"])).iterrows():
        spec, _, _ = row_to_spec(row)
        assert spec.run_id == row.run_id, "a plan must keep its id, so its earlier sittings match it"
        out.append(json.loads(spec.model_dump_json(exclude_defaults=True)))
    return out


def probe_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Per PROBE_CELLS entry, the plan of the fixed set at its cell's median time (typical, not the cheapest,
    whose time is mostly fixed overheads), each plan once; chosen from the earlier sittings' times only."""
    used, picks = set(), []
    for world_size, family in PROBE_CELLS:
        cell = rows[(rows.world_size == world_size) & (rows.family == family) & ~rows.run_id.isin(used)]
        pick = cell.sort_values(["iter_time_s", "run_id"]).iloc[len(cell) // 2]
        used.add(pick.run_id)
        picks.append(pick)
    return pd.DataFrame(picks)


def write_probe(rows: pd.DataFrame) -> None:
    spec = {"name": "probe-cpu", "points": points(rows, keep_order=True), "repeat_fraction": 0.0,
            "deadline_s": 240, "measure": MEASURE}  # fmt: skip
    PROBE_OUT.write_text(PROBE_HEADER + yaml.safe_dump(spec, sort_keys=False, width=200))
    print(f"{PROBE_OUT}: {len(rows)} probe plans")


def main() -> None:
    rows = choose(earlier_rows())
    write_probe(probe_rows(rows))
    spec = {
        "name": "cpu-sittings",
        "points": points(rows),
        "seed": SEED,
        "repeat_fraction": 0.1,
        "repeat_count": 3,
        "reference_every": 40,
        "deadline_s": 240,
        "measure": MEASURE,
    }
    OUT.write_text(HEADER + yaml.safe_dump(spec, sort_keys=False, width=200))
    print(f"{OUT}: {len(rows)} plans, ~{rows.wall_s.sum() / 60:.1f} min of measuring before repeats")


if __name__ == "__main__":
    main()
