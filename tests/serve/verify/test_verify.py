"""Verify before spending (serve.verify): a predict request's plans traced under fake tensors, from the shell and
over real HTTP, each traced peak beside its prediction; refused before any work when over its budget."""

import json
import subprocess
import sys

import pytest

from collect.fake.device import OUTSIDE_ALLOCATOR_BYTES, RESERVED_OVER_ALLOCATED
from serve.schemas import PredictRequest
from serve.verify.cost import HTTP_SECONDS, MAX_PLANS, plan_seconds
from tests.serve.conftest import CLUSTER, REPO, WORKLOAD, call
from tests.serve.test_http import PLANS

PIPELINED = {"dp": 2, "pp": 2, "num_microbatches": 8, "pp_schedule": "1f1b"}  # each traced stage costs ~10 s


def _verify(*args):
    command = [sys.executable, "-m", "serve", "verify", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_the_shell_traces_each_plan_beside_its_prediction(predictor_path, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"workload": WORKLOAD, "cluster": CLUSTER, "plans": [PLANS[0], PIPELINED]}))
    out = _verify(str(spec), "--model", str(predictor_path), "--json")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    flat, piped = body["plans"]
    for plan in (flat, piped):
        assert plan["status"] == "ok", plan["error"]
        assert plan["traced_peak_bytes"] == max(plan["traced_peak_per_stage_bytes"]) > 0
        # the A100 cluster is a GPU one: the trace gets what a GPU adds (collect.fake.device.on_device)
        on_gpu = plan["traced_peak_bytes"] * (1 + RESERVED_OVER_ALLOCATED) + OUTSIDE_ALLOCATOR_BYTES
        assert plan["traced_on_gpu_bytes"] == pytest.approx(on_gpu)
        # the prediction is a peak allocated, like the trace; what a GPU adds decides only whether it fits
        ratio = plan["prediction"]["peak_mem_bytes"] / plan["traced_peak_bytes"]
        assert plan["predicted_over_traced"] == pytest.approx(ratio)
        lo, hi = plan["prediction"]["peak_mem_interval_bytes"]
        assert plan["within_interval"] == (lo <= plan["traced_peak_bytes"] <= hi)
        assert plan["traced_fits"] == (on_gpu <= body["capacity_bytes"])
        parts = plan["simulated"][0]
        assert {"weights", "gradients", "optimizer", "activations", "peak_bytes"} <= set(parts)
    assert flat["traced_ranks"] == [0] and len(flat["simulated"]) == 1
    # a pipeline is traced on each stage's first rank, and the simulator's breakdown is given per pipeline rank
    assert piped["traced_ranks"] == [0, 2] and len(piped["simulated"]) == 2
    spec.write_text(json.dumps({"workload": WORKLOAD, "cluster": CLUSTER, "plans": [PLANS[0]]}))
    table = _verify(str(spec), "--model", str(predictor_path))
    assert table.returncode == 0, table.stderr
    assert "pred/tr" in table.stdout and len(table.stdout.splitlines()) == 3
    assert f"{flat['traced_peak_bytes'] / 2**30:.1f}" in table.stdout.splitlines()[1]


def test_the_shell_refuses_plans_over_its_budget_before_any_work(predictor_path, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"workload": WORKLOAD, "cluster": CLUSTER, "plans": [PIPELINED]}))
    out = _verify(str(spec), "--model", str(predictor_path), "--budget-s", "10")
    estimate = plan_seconds(PredictRequest.model_validate(json.loads(spec.read_text())).specs()[0])
    assert out.returncode == 2 and estimate > 10
    assert f"plans: tracing them is estimated at {estimate:.0f} s" in out.stderr and "--budget-s 10" in out.stderr


def test_post_verify_answers_a_plan_and_refuses_what_is_over_its_budget(server):
    body = {"workload": WORKLOAD, "cluster": CLUSTER, "plans": [PLANS[1]]}
    status, answer = call(server.base_url, "POST", "/verify", body, timeout=300)
    assert status == 200, answer
    (plan,) = answer["plans"]
    assert plan["status"] == "ok" and plan["traced_peak_bytes"] > 0 and answer["budget_s"] == HTTP_SECONDS
    assert "NCCL's buffers" in answer["unseen"]

    many = {**body, "plans": [PLANS[0]] * 12}
    cost = plan_seconds(PredictRequest.model_validate(many).specs()[0])
    assert 12 * cost > HTTP_SECONDS  # the premise: each plan is cheap enough, twelve are not
    status, refused = call(server.base_url, "POST", "/verify", many)
    assert status == 422 and refused["detail"][0]["type"] == "verify_over_budget"
    assert refused["detail"][0]["loc"] == ["body", "plans"] and "POST /verify" in refused["detail"][0]["msg"]
    status, refused = call(server.base_url, "POST", "/verify", {**body, "plans": [PLANS[0]] * (MAX_PLANS + 1)})
    assert status == 422 and f"at most {MAX_PLANS} plans" in refused["detail"][0]["msg"]
