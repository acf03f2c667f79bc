"""`python -m collect measure SPEC.json` end to end, and its error messages."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.distributed


def _run(tmp_path, spec: dict):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return subprocess.run(
        [sys.executable, "-m", "collect", "measure", str(path), "--iters", "2", "--warmup", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )


SPEC = {
    "workload": {
        "layers": 2,
        "hidden": 64,
        "heads": 4,
        "seq_len": 16,
        "vocab": 128,
        "micro_batch_size": 2,
        "global_batch_size": 4,
    },
    "plan": {"dp": 2, "sharding": "fsdp_full"},
    "cluster": {"nodes": 1, "devices_per_node": 2, "device": "cpu", "memory_bytes": 2**30, "backend": "gloo"},
}


def test_measure_prints_the_row_as_json(tmp_path):
    proc = _run(tmp_path, SPEC)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)
    assert row["status"] == "ok" and row["world_size"] == 2 and row["sharding"] == "fsdp_full"
    assert row["iter_time_s"] > 0 and len(row["peak_mem_bytes_per_rank"]) == 2
    assert row["peak_mem_bytes"] == max(row["peak_mem_bytes_per_rank"])


def test_invalid_spec_is_rejected_before_any_process_starts(tmp_path):
    bad = {**SPEC, "plan": {"dp": 2, "tp": 2}}
    proc = _run(tmp_path, bad)
    assert proc.returncode != 0
    assert "plan.dp (2) * plan.cp (1) * plan.tp (2) * plan.pp (1) = 4 != cluster world size" in proc.stderr
    assert "Traceback" not in proc.stderr
