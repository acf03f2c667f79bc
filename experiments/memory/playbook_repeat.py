"""How repeatable the Playbook's H100 peaks are: the error no prediction from the plan alone can go below.

    python -m experiments.memory.playbook_repeat

The Playbook ran many layouts (model, tp, pp, micro-batch size, ZeRO stage) at several data-parallel degrees. At a
given layout, the data-parallel degree moves a rank's allocated peak by what the simulator prices (ZeRO-1's share
of the optimizer, the number of micro-batches), so a run's measured peak over its simulated one should be the
same at every degree. How far it is not bounds what a predictor of the plan can do: each run of a layout run at
GROUP or more degrees is predicted by an oracle that knows the other runs' measured peaks, its simulated peak times
their median ratio, and scored like any predictor (absolute percentage error). Per split of the held-out H100
evaluations (the 80B model; the 32-node runs) and overall; writes experiments/results/playbook_repeat.json.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd
from tqdm import tqdm

from collect import REPO
from collect.store import ResultStore
from gnn.dataset.rows import row_to_spec
from gnn.explain import memory_parts

RUNS = [REPO / "data" / "runs" / f"{name}.parquet" for name in ("playbook-h100", "playbook-h100-8b")]
OUT = REPO / "experiments" / "results" / "playbook_repeat.json"
LAYOUT = ["num_params", "tp", "pp", "micro_batch_size", "sharding"]
GROUP = 3  # runs of a layout the oracle needs: itself and two others to take a median of


def simulated(rows: pd.DataFrame) -> pd.Series:
    """Each row's simulated peak of the rank the Playbook measured (rank 0: the first pipeline stage)."""
    peaks = []
    for _, row in tqdm(rows.iterrows(), total=len(rows), desc="simulated", unit="run"):
        spec, hardware, _ = row_to_spec(row)
        peaks.append(memory_parts(spec, hardware)[0]["peak_bytes"])
    return pd.Series(peaks, index=rows.index)


def oracle_errors(rows: pd.DataFrame) -> pd.Series:
    """|oracle / measured - 1| for each run of a layout run GROUP or more times (NaN for the rest)."""
    ratio = rows["peak_mem_bytes"] / rows["simulated"]
    out = pd.Series(np.nan, index=rows.index)
    for _, group in ratio.groupby([rows[c] for c in LAYOUT]):
        if len(group) < GROUP:
            continue
        for i in group.index:
            out[i] = abs(group.drop(index=i).median() / group[i] - 1)
    return out


def summary(errors: pd.Series, simulator: pd.Series) -> dict:
    scored = errors.notna()
    return {
        "runs": int(scored.sum()),
        "oracle_mape": float(errors[scored].mean()),
        "oracle_median_ape": float(errors[scored].median()),
        "simulator_mape_same_runs": float(simulator[scored].mean()),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    rows = pd.concat([ResultStore(path).load() for path in RUNS], ignore_index=True)
    rows = rows[(rows["status"] == "ok") & rows["peak_mem_bytes"].notna()].copy()
    rows["simulated"] = simulated(rows)
    errors = oracle_errors(rows)
    simulator = (rows["simulated"] / rows["peak_mem_bytes"] - 1).abs()
    big, wide = rows["num_params"] > 50e9, rows["nodes"] == 32  # the held-out splits h100/held_out_size and _scale
    splits = {"all": rows.index, "80B": rows.index[big], "32 nodes": rows.index[wide]}
    result = {name: summary(errors[idx], simulator[idx]) for name, idx in splits.items()}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
