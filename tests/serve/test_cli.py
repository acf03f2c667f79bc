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
    out = _run("predict", str(spec), "--model", str(predictor_path), "--json")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["model"]["name"] == "test-model" and len(body["predictions"]) == 3
    p = body["predictions"][1]
    assert set(p) >= {"iter_time_s", "iter_time_interval_s", "peak_mem_bytes", "fits"}
    assert body["compute_pricing"] == "the datasheet of 'a100-80gb': no kernel table was measured on this GPU"
    assert body["calibration"] == "in-distribution"  # a model saved without the new-source calibration
    from collect.schema import Plan, RunSpec, Workload
    from serve.schemas import ClusterSpec

    direct = predictor.predict(
        [
            RunSpec.model_construct(
                workload=Workload(**WORKLOAD), plan=Plan(**PLANS[1]), cluster=ClusterSpec(**CLUSTER).cluster()
            )
        ],
        "a100-80gb",
    )
    assert abs(p["iter_time_s"] / direct["iter_time_s"].iloc[0] - 1) < 1e-5


def test_bad_spec_exits_2_naming_the_field(predictor_path, tmp_path):
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps({"workload": {**WORKLOAD, "hidden": 1000}, "cluster": CLUSTER, "plans": PLANS}))
    out = _run("predict", str(spec), "--model", str(predictor_path), "--json")
    assert out.returncode == 2 and "hidden (1000) must be divisible by workload.heads (16)" in out.stderr
    missing = _run("predict", str(tmp_path / "nope.json"), "--model", str(predictor_path))
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_a_prediction_imports_only_what_it_needs(predictor_path, tmp_path):
    """What makes `serve predict` cost about two `import torch` (experiments/bench/cli.py times it): none of
    PyG (2.6 s: it imports torch._dynamo), Lightning, sklearn, scipy.optimize, MLflow (for a model file) or the
    measurement pool is imported to answer. Checked by name, not by the clock."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"workload": WORKLOAD, "cluster": CLUSTER, "plans": PLANS[:1]}))
    probe = (
        "import sys\nfrom serve.cli import main\nmain([sys.argv[1], '--model', sys.argv[2]])\n"
        "heavy = ['torch_geometric', 'lightning', 'sklearn', 'scipy.optimize', 'mlflow', 'collect.launch.pool']\n"
        "print('LOADED', [m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(spec), str(predictor_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout


def test_search_takes_nodes_for_a_cluster_given_as_json_unless_it_says_its_own():
    from argparse import Namespace

    from serve.search.cli import build_request

    workload = json.dumps({**WORKLOAD, "dtype": "bfloat16"})
    args = dict(request=None, workload=workload, objective="time", trials=10, sampler="optuna", framework="megatron")
    rack = build_request(Namespace(**args, cluster='{"preset": "gb200-nvl72", "devices_per_node": 64}', nodes=4))
    assert rack.cluster.world_size == 256
    own = build_request(Namespace(**args, cluster='{"preset": "a100-80gb", "nodes": 2}', nodes=4))
    assert own.cluster.world_size == 16


def test_a_prediction_says_what_compute_was_priced_from():
    from serve.api import compute_pricing
    from serve.schemas import PredictRequest

    def pricing(workload: dict) -> str:
        body = {"workload": workload, "cluster": {"preset": "h100-80gb", "nodes": 1}, "plans": [{"dp": 8}]}
        request = PredictRequest.model_validate(body | {"workload": {**workload, "global_batch_size": 8}})
        return compute_pricing(request, request.specs())

    table = "kernel table 'h100-sxm-20261127', measured on this GPU (data/hardware/kernels)"
    assert pricing(WORKLOAD) == table
    mla = {**WORKLOAD, "family": "llama", "ffn_hidden": 2816, "kv_lora_rank": 64, "qk_rope_head_dim": 16}
    mla |= {"qk_nope_head_dim": 32, "v_head_dim": 32}
    assert pricing(mla) == table + "; MLA's attention core from the datasheet"


RUNS_CSV = """preset,devices_per_node,layers,hidden,heads,seq_len,vocab,micro_batch_size,global_batch_size,dtype,dp,num_microbatches,iter_time_s,peak_mem_bytes
a100-80gb,4,12,1024,16,1024,51200,1,16,bfloat16,4,4,0.8,9000000000
a100-80gb,4,12,1024,16,1024,51200,2,16,bfloat16,4,2,0.7,
"""  # noqa: E501 (a CSV's header is one line)


def test_runs_from_a_clusters_logs_become_a_probe(predictor_path, tmp_path):
    csv, runs = tmp_path / "runs.csv", tmp_path / "runs"
    csv.write_text(RUNS_CSV)
    runs.mkdir()
    out = _run("probe", "mine", "--rows", str(csv), "--runs", str(runs), "--model", str(predictor_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("measured") == 2 and "mine: 2 runs on a100-80gb" in out.stdout
    again = _run("probe", "mine", "--rows", str(csv), "--runs", str(runs), "--model", str(predictor_path))
    assert again.returncode == 2 and "exists" in again.stderr  # stored runs are never overwritten


def test_bad_probe_rows_name_their_line_and_field_and_store_nothing(predictor_path, tmp_path):
    csv, runs = tmp_path / "runs.csv", tmp_path / "runs"
    runs.mkdir()
    bad = RUNS_CSV.replace("0.8,9000000000", "-1,9000000000").replace(",2,16,bfloat16,4,2,", ",2,16,bfloat16,3,2,")
    csv.write_text(bad)
    out = _run("probe", "mine", "--rows", str(csv), "--runs", str(runs), "--model", str(predictor_path))
    assert out.returncode == 2
    assert "line 2: iter_time_s: must be a positive number" in out.stderr
    assert "line 3: " in out.stderr and "plan.dp (3)" in out.stderr
    csv.write_text(RUNS_CSV.replace("preset,", "gpu_type,"))
    out = _run("probe", "mine", "--rows", str(csv), "--runs", str(runs), "--model", str(predictor_path))
    assert out.returncode == 2 and "column 'gpu_type': not a field" in out.stderr
    assert list(runs.iterdir()) == []


def test_predict_prints_a_table_by_default(predictor_path, tmp_path):
    """A person at a shell gets one line per plan, in plan order, with its time, peak and verdict."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"workload": WORKLOAD, "cluster": CLUSTER, "plans": PLANS}))
    out = _run("predict", str(spec), "--model", str(predictor_path))
    assert out.returncode == 0, out.stderr
    header, columns, rule, *rows = out.stdout.splitlines()
    assert header.startswith("model ") and "intervals: in-distribution" in header
    assert "time s" in columns and "peak GiB" in columns and "fits" in columns
    plans = [row for row in rows if row.strip()[:1].isdigit()]
    assert [int(r.split()[0]) for r in plans] == [1, 2, 3]
    assert all(f"dp{p.get('dp', 1)} tp{p.get('tp', 1)} pp{p.get('pp', 1)}" in r for p, r in zip(PLANS, plans))
