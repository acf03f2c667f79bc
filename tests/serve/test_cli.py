"""`python -m serve predict SPEC.json` as a user runs it: JSON out in plan order, clear errors on bad input."""
import json
import subprocess
import sys

from tests.serve.conftest import CLUSTER, REPO, WORKLOAD
from tests.serve.test_http import PLANS


def _run(*args):
    return subprocess.run([sys.executable, "-m", "serve", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_predict_prints_predictions_in_plan_order(predictor_path, predictor, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"workload": WORKLOAD, "cluster": CLUSTER, "plans": PLANS}))
    out = _run("predict", str(spec), "--model", str(predictor_path))
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["model"]["name"] == "test-model" and len(body["predictions"]) == 3
    p = body["predictions"][1]
    assert set(p) >= {"iter_time_s", "iter_time_interval_s", "peak_mem_bytes", "fits"}
    from collect.schema import Plan, RunSpec, Workload
    from serve.schemas import ClusterSpec

    direct = predictor.predict([RunSpec.model_construct(workload=Workload(**WORKLOAD), plan=Plan(**PLANS[1]),
                                                        cluster=ClusterSpec(**CLUSTER).cluster())], "a100-80gb")
    assert abs(p["iter_time_s"] / direct["iter_time_s"].iloc[0] - 1) < 1e-5


def test_bad_spec_exits_2_naming_the_field(predictor_path, tmp_path):
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps({"workload": {**WORKLOAD, "hidden": 1000}, "cluster": CLUSTER, "plans": PLANS}))
    out = _run("predict", str(spec), "--model", str(predictor_path))
    assert out.returncode == 2 and "hidden (1000) must be divisible by heads (16)" in out.stderr
    missing = _run("predict", str(tmp_path / "nope.json"), "--model", str(predictor_path))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
