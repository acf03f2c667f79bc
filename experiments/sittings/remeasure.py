"""cpu-v4: the GPT plans of cpu-v1 and cpu-v2 measured again with the current protocol (collect/sweeps/cpu-v4.yaml).

cpu-v1/v2 took 3 timed steps after two memory-window steps, unpinned, and read peaks by older methods; cpu-v3 on
take one more warm-up step and 5 timed steps, pin each rank to a core and count every allocation. Each distinct
(workload, plan) of the old sweeps is measured once more at one capacity (16 GiB, so every plan runs: the old rows'
small capacities only decided their oom labels, and a measured peak decides any capacity's). The dataset then
trains on the new row of a plan and keeps the old rows for the record (gnn.dataset.rows.drop_superseded).

    python -m experiments.sittings.remeasure   # rewrites collect/sweeps/cpu-v4.yaml
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml

from gnn.dataset.rows import plan_key, row_to_spec

OLD = ("cpu-v1", "cpu-v2")
CAPACITY = 16 * 2**30
OUT = Path("collect/sweeps/cpu-v4.yaml")

HEADER = """\
# The GPT plans of cpu-v1 and cpu-v2, each once more with the current protocol (cpu-v3's: counting allocator, ranks
# pinned, a warm-up step, 5 timed steps), at one 16 GiB capacity. Written by `python -m experiments.sittings.remeasure`.
# Resumable: python -m collect sweep collect/sweeps/cpu-v4.yaml
"""


def distinct_plans(runs: Path = Path("data/runs")) -> list[dict]:
    rows = pd.concat([pd.read_parquet(runs / f"{name}.parquet") for name in OLD], ignore_index=True)
    rows = rows[~rows.is_reference.fillna(False).astype(bool)]
    seen, out = set(), []
    for _, row in rows.iterrows():
        spec, _, _ = row_to_spec(row)
        key = plan_key(spec)
        if key in seen:
            continue
        seen.add(key)
        dump = json.loads(spec.model_dump_json(exclude_defaults=True))
        dump["cluster"]["memory_bytes"] = CAPACITY
        out.append(dump)
    return out


def main() -> None:
    points = distinct_plans()
    spec = {
        "name": "cpu-v4",
        "points": points,
        "seed": 4,
        "repeat_fraction": 0.05,
        "repeat_count": 3,
        "reference_every": 60,
        "deadline_s": 240,
        "measure": {"warmup_iters": 1, "timed_iters": 5, "memory_window_iters": 2, "pin_cores": True},
    }
    OUT.write_text(HEADER + yaml.safe_dump(spec, sort_keys=False, width=200))
    print(f"{OUT}: {len(points)} plans")


if __name__ == "__main__":
    main()
