"""`python -m collect measure SPEC.json` end to end, and its error messages."""

import json
import os
import subprocess
import sys

import pytest

from collect.measure.memory import CPU_FALLBACK_METHOD

pytestmark = pytest.mark.distributed


def _run(tmp_path, spec: dict, *flags: str, env: dict | None = None):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return subprocess.run(
        [sys.executable, "-m", "collect", "measure", str(path), "--iters", "2", "--warmup", "0", *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
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


def test_a_plan_over_its_capacity_is_refused_unless_allowed(tmp_path):
    """The spec's training state alone (117,504 parameters x 16 B, FSDP-sharded over 2 ranks: 0.9 MiB) is over a
    256 KiB capacity: refused before any rank starts, with the arithmetic; --allow-oom runs it, and the measured
    peak labels it oom."""
    small = {**SPEC, "cluster": {**SPEC["cluster"], "memory_bytes": 2**18}}
    refused = _run(tmp_path, small)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "cannot fit, so nothing is run" in refused.stderr and "> cluster.memory_bytes 262,144 B" in refused.stderr
    allowed = _run(tmp_path, small, "--allow-oom")
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["status"] == "oom"


def test_without_a_compiler_rows_say_how_their_peak_was_read(tmp_path):
    """No compiler or ninja on PATH and no built allocator: one line says what to install, the plan is measured,
    and its row names the fallback method, never the counting allocator's."""
    (tmp_path / "bin").mkdir()
    env = {**os.environ, "PATH": str(tmp_path / "bin"), "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions")}
    proc = _run(tmp_path, SPEC, env=env)
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "counting allocator" in line]
    assert len(notes) == 1 and "apt-get install g++" in notes[0] and "Traceback" not in proc.stderr
    row = json.loads(proc.stdout)
    assert row["status"] == "ok" and row["peak_mem_method"] == CPU_FALLBACK_METHOD
    assert row["peak_mem_bytes"] > 0


def test_a_probe_measures_its_plans_with_a_fresh_fingerprint_and_names_itself(tmp_path):
    """`python -m collect probe`: a fingerprint, then the first K probe plans, stored as a sweep named by --name."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "collect",
            "probe",
            "--k",
            "1",
            "--name",
            "probe-test",
            "--out",
            str(tmp_path),
            "--hardware",
            str(tmp_path),
            "--no-block-profile",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "--probe probe-test" in out.stdout
    from gnn.inference.probe import load_probe

    rows = load_probe("probe-test", tmp_path)
    assert len(rows) == 1 and rows["status"].eq("ok").all() and rows["world_size"].iloc[0] == 1
    assert (tmp_path / f"{rows['fingerprint_id'].iloc[0]}.json").exists()
    bad = subprocess.run([sys.executable, "-m", "collect", "probe", "--k", "11", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode != 0 and "--k 11" in bad.stderr
