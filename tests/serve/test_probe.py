"""A probe's runs correcting the service's predictions (gnn.inference.probe), over HTTP and from the shell, with
the probe the collector measured on this machine (data/runs/probe-20261126T052518: its three plans and fingerprint)."""

import json
import math
import subprocess
import sys

import pytest

from collect.store import ResultStore
from serve.client import PlansightError
from tests.serve.conftest import REPO

PROBE = "probe-20261126T052518"
ROWS = ResultStore(REPO / "data" / "runs" / f"{PROBE}.parquet").load()
ROWS = ROWS[~ROWS["is_reference"].astype(bool)]  # each world size's reference plan, measured as in every sweep
FINGERPRINT = ROWS["fingerprint_id"].iloc[0]
WORKLOAD = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 512, "micro_batch_size": 1,
            "global_batch_size": 4, "dtype": "float32"}  # fmt: skip
CLUSTER = {"fingerprint": FINGERPRINT, "devices_per_node": 2, "memory_bytes": 2**30}
PLANS = [{"dp": 2, "num_microbatches": 2}, {"dp": 1, "pp": 2, "num_microbatches": 4, "pp_schedule": "1f1b"}]


def _log_width(p: dict) -> float:
    lo, hi = p["iter_time_interval_s"]
    return math.log(hi / lo)


def test_a_probe_moves_every_time_by_its_factor_and_widens_the_intervals(server):
    plain = server.predict(WORKLOAD, CLUSTER, PLANS)
    probed = server.predict(WORKLOAD, CLUSTER, PLANS, probe=PROBE)
    assert plain["probe"] is None
    info = probed["probe"]
    assert info["probe"] == PROBE and info["runs"] == len(ROWS) == 3 and info["log_sd"] > 0
    for before, after in zip(plain["predictions"], probed["predictions"]):
        assert after["iter_time_s"] == pytest.approx(before["iter_time_s"] * info["time_factor"], rel=1e-6)
        assert _log_width(after) > _log_width(before)
        assert after["peak_mem_bytes"] == before["peak_mem_bytes"]  # sittings do not move memory


def test_an_unknown_probe_is_a_422_naming_the_field(server):
    for name in ("no-such-probe", "../../etc/passwd"):
        with pytest.raises(PlansightError) as e:
            server.predict(WORKLOAD, CLUSTER, PLANS, probe=name)
        assert e.value.status == 422 and "probe" in json.dumps(e.value.detail)
    assert server.health()["status"] == "ok"


def _run(*args):
    return subprocess.run([sys.executable, "-m", "serve", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_the_shell_reports_a_probe_and_predicts_with_it(predictor_path, tmp_path):
    out = _run("probe", PROBE, "--model", str(predictor_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("measured") == 3 and f"--probe {PROBE}" in out.stdout
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"workload": WORKLOAD, "cluster": CLUSTER, "plans": PLANS}))
    out = _run("predict", str(spec), "--model", str(predictor_path), "--probe", PROBE)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["probe"]["runs"] == 3
    bad = _run("predict", str(spec), "--model", str(predictor_path), "--probe", "missing")
    assert bad.returncode == 2 and "--probe" in bad.stderr and "missing" in bad.stderr
