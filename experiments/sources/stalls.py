"""Where the Playbook's error on a model that never saw it comes from: its runs in three kinds, each scored apart.

    python -m experiments.sources.stalls [--rows experiments/results/loso_rows.csv]

The Playbook's finished runs (Nanotron on H100 nodes of 8) fall into three kinds, told apart by the physics alone
(the simulator, priced from the H100's kernel table; experiments.kernels.physics):
- tp across nodes: tensor parallelism over more GPUs than a node holds, its collectives on the network in every
  layer;
- a stalled pipeline: pp > 1, and the run took more than STALL_S per micro-batch longer than the physics says. Such
  runs wait 0.5 to 1.6 s per micro-batch whatever the model, micro-batch size, tp or node count, a gap the other
  pipelined runs (most within 0.2 s) do not approach; where no plan field tells them apart, no model can;
- the rest.
Per kind: the runs' share, the held-out model's median APE, bias and 80% coverage with the interval calibrated on
the other sources (experiments.sources.report, K = 0), and the stalls' share by node count with their excess per
micro-batch. Writes experiments/results/playbook_stalls.json and prints it.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd
from tqdm import tqdm

from collect import REPO
from experiments.kernels.physics import RUNS, hardware, physics_seconds
from experiments.sources.loso import ROWS
from experiments.sources.report import stats, time_columns
from gnn.inference import new_source

OUT = REPO / "experiments" / "results" / "playbook_stalls.json"
SOURCE = "playbook"
STALL_S = 0.4  # seconds per micro-batch over the physics: the trough between the two modes of the pipelined runs
PRESET = "h100-80gb"


def with_physics(rows: pd.DataFrame) -> pd.DataFrame:
    """The source's held-out rows beside their plans' physics (seconds per iteration) and micro-batch counts."""
    runs = pd.concat([pd.read_parquet(RUNS / f"{n}.parquet") for n in ("playbook-h100", "playbook-h100-8b")])
    runs = runs.set_index("run_id").loc[rows["run_id"]]
    hw = hardware(PRESET, table=True)
    physics = [physics_seconds(run, hw) for _, run in tqdm(runs.iterrows(), total=len(runs), desc="physics")]
    return rows.assign(physics_s=physics, num_microbatches=runs["num_microbatches"].to_numpy())


def kinds(rows: pd.DataFrame, devices_per_node: int = 8) -> pd.Series:
    excess = (rows["iter_time_s"] - rows["physics_s"]) / rows["num_microbatches"]
    kind = pd.Series("the rest", index=rows.index)
    kind[(rows["pp"] > 1) & (excess > STALL_S)] = "stalled pipeline"
    kind[rows["tp"] > devices_per_node] = "tp across nodes"
    return kind


def analyse(rows: pd.DataFrame) -> dict:
    own = rows[(rows["source"] == SOURCE) & (rows["status"] == "ok") & rows["iter_time_s"].notna()]
    calibration = new_source.fit(rows[rows["source"] != SOURCE])
    own = with_physics(own.reset_index(drop=True))
    own = own.assign(kind=kinds(own), excess_s=(own["iter_time_s"] - own["physics_s"]) / own["num_microbatches"])
    widened = new_source.widen(time_columns(own), {"time": calibration["time"]})
    calibrated = ("point_s", "lo_s", "hi_s")  # the interval a user would have been shown, K = 0
    own = own.assign(**{k: widened[c] for k, c in zip(calibrated, new_source.INTERVALS["time"])})
    out = {"runs": len(own), "stall_s": STALL_S, "kinds": {}}
    for name, group in [("all", own), *own.groupby("kind")]:
        columns = [group[c].to_numpy(dtype=float) for c in calibrated]
        out["kinds"][name] = {"share": len(group) / len(own), **stats(group["iter_time_s"].to_numpy(), *columns)}
    pipelined = own[(own["pp"] > 1) & (own["kind"] != "tp across nodes")]
    stalled = pipelined[pipelined["kind"] == "stalled pipeline"]
    by_nodes = pipelined.groupby("nodes")["kind"].agg(
        runs="size", stalled=lambda k: int((k == "stalled pipeline").sum())
    )
    out["stalls_by_nodes"] = {int(n): r.to_dict() for n, r in by_nodes.iterrows()}
    out["stall_excess_s"] = {f"p{q}": float(np.percentile(stalled["excess_s"], q)) for q in (10, 50, 90)}
    out["other_pipelined_excess_s"] = {
        f"p{q}": float(np.percentile(pipelined.loc[pipelined["kind"] != "stalled pipeline", "excess_s"], q))
        for q in (10, 50, 90)
    }
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=str(ROWS))
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    out = analyse(pd.read_csv(args.rows))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(pd.DataFrame(out["kinds"]).T.round(3).to_string())
    print(pd.DataFrame(out["stalls_by_nodes"]).T.to_string())
    print(
        "excess per micro-batch, stalled:", out["stall_excess_s"], "other pipelined:", out["other_pipelined_excess_s"]
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
