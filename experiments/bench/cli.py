"""How long one `python -m serve predict` takes against `python -c "import torch"` on the same machine.

    python -m experiments.bench.cli [--model PATH_OR_URI] [--repeats 5]

Runs the two commands alternately (so machine drift falls on both alike) and
prints each time and the ratio of the medians. Writes
experiments/results/bench_cli.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

from collect import REPO

SPEC = {
    "workload": {
        "layers": 12,
        "hidden": 1024,
        "heads": 16,
        "seq_len": 1024,
        "vocab": 51200,
        "micro_batch_size": 1,
        "global_batch_size": 16,
        "dtype": "bfloat16",
    },
    "cluster": {"preset": "a100-80gb", "devices_per_node": 4},
    "plans": [{"dp": 4, "num_microbatches": 4}],
}


def _seconds(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models:/plansight@champion")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(SPEC, f)
    torch_s, predict_s = [], []
    for _ in range(args.repeats):
        torch_s.append(_seconds([sys.executable, "-c", "import torch"]))
        predict_s.append(_seconds([sys.executable, "-m", "serve", "predict", f.name, "--model", args.model]))
    result = {
        "import_torch_s": torch_s,
        "serve_predict_s": predict_s,
        "ratio_of_medians": statistics.median(predict_s) / statistics.median(torch_s),
        "model": args.model,
    }
    print(json.dumps(result, indent=1))
    out = REPO / "experiments" / "results" / "bench_cli.json"
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
