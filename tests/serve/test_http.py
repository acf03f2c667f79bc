"""The service over real HTTP: every endpoint, bad inputs, oversize requests, and that it survives them."""

import json
import urllib.request

import pytest

from collect.fake.device import on_device
from serve.client import PlansightError
from tests.serve.conftest import CLUSTER, WORKLOAD

PLANS = [
    {"dp": 4, "num_microbatches": 4},
    {"dp": 2, "tp": 2, "num_microbatches": 8, "sharding": "fsdp_grad_op"},
    {"dp": 1, "pp": 4, "num_microbatches": 16, "pp_schedule": "1f1b"},
]


def test_health_and_model(server):
    assert server.health()["status"] == "ok"
    model = server.model()
    assert model["name"] == "test-model" and model["members"] == 2


def test_featurisation_workers_start_with_the_server(server):
    """Warmed at start-up in the background (a large batch would otherwise wait seconds for them)."""
    import time

    deadline = time.monotonic() + 120
    while server.model()["featurisation_workers_ready"] < 1:
        assert time.monotonic() < deadline, "the featurisation workers did not start"
        time.sleep(0.5)


def test_predict_many_plans_in_order(server, predictor):
    body = server.predict(WORKLOAD, CLUSTER, PLANS)
    preds = body["predictions"]
    assert len(preds) == 3
    for p in preds:
        lo, hi = p["iter_time_interval_s"]
        assert 0 < lo <= p["iter_time_s"] <= hi
        assert isinstance(p["fits"], bool) and set(p["breakdown"]) == {"compute", "communication_exposed", "bubble"}
        assert isinstance(p["extrapolation"], list)  # the test model records its training range
    # plan order is kept: the same plans asked one by one give the same answers
    single = server.predict(WORKLOAD, CLUSTER, [PLANS[2]])["predictions"][0]
    assert single["iter_time_s"] == pytest.approx(preds[2]["iter_time_s"], rel=1e-5)


def test_a_cluster_states_its_network_and_each_prediction_its_oom_risk(server):
    """Two nodes of 4 with one NIC each: data parallelism across them pays for it; a bad network is a 422."""
    cluster = {**CLUSTER, "nodes": 2}
    plan = [{"dp": 8, "num_microbatches": 2}]
    dgx = server.predict(WORKLOAD, cluster, plan)["predictions"][0]
    slow = server.predict(WORKLOAD, {**cluster, "nics_per_node": 1}, plan)["predictions"][0]
    assert slow["breakdown"]["communication_exposed"] > dgx["breakdown"]["communication_exposed"]
    assert 0.0 <= dgx["oom_risk"] <= 1.0
    with pytest.raises(PlansightError) as e:
        server.predict(WORKLOAD, {**cluster, "nvlink_domain": 6}, plan)
    assert e.value.status == 422 and "nvlink_domain" in str(e.value.detail)


def test_fits_is_one_answer_the_oom_risk_under_its_stated_threshold(server):
    """One answer to "does it fit": fits is oom_risk <= 0.1 (the whole 80% memory interval fits, with what a GPU
    holds beyond its tensors), and no second head (the network's own out-of-memory classifier) is answered beside
    it. On a device that holds the interval's upper end but not what a GPU adds to it, or between the predicted
    peak and that end, the plan does not fit, though its point would."""
    plan = [PLANS[0]]
    p = server.predict(WORKLOAD, CLUSTER, plan)["predictions"][0]
    assert "oom_prob" not in p
    point, (_, hi) = p["peak_mem_bytes"], p["peak_mem_interval_bytes"]
    assert point < hi
    on_gpu = [on_device(b, "cuda") for b in (hi, (point * hi) ** 0.5)]
    cases = ((on_gpu[0] * 1.05, True), (hi * 1.05, False), (on_gpu[1], False), (point * 0.9, False))
    for capacity, fits in ((int(c), f) for c, f in cases):
        q = server.predict(WORKLOAD, {**CLUSTER, "memory_bytes": capacity}, plan)["predictions"][0]
        assert q["fits"] is fits and (q["oom_risk"] <= 0.1) is fits, (capacity, q["oom_risk"])


def test_a_plan_outside_the_training_rows_says_what_lies_outside(server):
    big = {**WORKLOAD, "layers": 96, "hidden": 8192, "heads": 64}
    outside = server.predict(big, CLUSTER, [PLANS[0]])["predictions"][0]["extrapolation"]
    assert "hidden 8.19e+03 above the largest trained on a100, 2.05e+03" in outside


def test_invalid_plan_is_422_naming_the_field_and_rule(server):
    with pytest.raises(PlansightError) as e:
        server.predict(WORKLOAD, CLUSTER, [PLANS[0], {"dp": 4, "num_microbatches": 3}])
    assert e.value.status == 422
    assert "plans[1]" in str(e.value.detail) and "global_batch_size" in str(e.value.detail)


@pytest.mark.parametrize(
    "body, field",
    [
        ({"workload": {**WORKLOAD, "heads": 0}, "cluster": CLUSTER, "plans": PLANS}, "heads"),
        ({"workload": WORKLOAD, "cluster": {"preset": "tpu-v9"}, "plans": PLANS}, "tpu-v9"),
        (
            {"workload": WORKLOAD, "cluster": CLUSTER, "plans": [{"dp": 4, "num_microbatches": 4, "shardin": "none"}]},
            "shardin",
        ),
        ({"workload": WORKLOAD, "cluster": CLUSTER, "plans": []}, "plans"),
        (
            {
                "workload": {**WORKLOAD, "layers": 10_000, "hidden": 10**5, "heads": 100},
                "cluster": CLUSTER,
                "plans": PLANS,
            },
            "parameters is over the limit",
        ),
        ({"workload": WORKLOAD, "cluster": {"preset": "a100-80gb", "nodes": 10**4}, "plans": PLANS}, "over the limit"),
    ],
)
def test_bad_requests_get_clear_4xx(server, body, field):
    with pytest.raises(PlansightError) as e:
        server._call("POST", "/predict", body)
    assert e.value.status == 422 and field in json.dumps(e.value.detail)
    assert server.health()["status"] == "ok"


def test_too_many_plans_and_oversize_bodies_are_refused(server):
    with pytest.raises(PlansightError) as e:
        server.predict(WORKLOAD, CLUSTER, [PLANS[0]] * 10_001)
    assert e.value.status == 422 and "10000" in json.dumps(e.value.detail)
    # a 9 MiB body is refused from its Content-Length, before it is read
    import http.client
    from urllib.parse import urlparse

    url = urlparse(server.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.putrequest("POST", "/predict")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(9 * 2**20))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413 and b"over the limit" in response.read()
    conn.close()
    assert server.health()["status"] == "ok"


def test_malformed_json_is_422_and_the_server_survives(server):
    req = urllib.request.Request(
        server.base_url + "/predict", data=b'{"workload": ', method="POST", headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 422
    assert server.health()["status"] == "ok"


def test_search_endpoint_returns_feasible_top_plans(server):
    body = server.search(WORKLOAD, CLUSTER, objective="time", trials=40, top_k=3)
    assert body["trials"] == 40 and 1 <= len(body["best"]) <= 3
    times = [r["prediction"]["iter_time_s"] for r in body["best"]]
    assert times == sorted(times) and all(r["prediction"]["fits"] for r in body["best"])
    with pytest.raises(PlansightError) as e:
        server.search(WORKLOAD, CLUSTER, trials=10**6)
    assert e.value.status == 422 and "trials" in json.dumps(e.value.detail)


def test_openapi_schema_is_served(server):
    with urllib.request.urlopen(server.base_url + "/openapi.json", timeout=30) as resp:
        schema = json.loads(resp.read())
    assert {"/predict", "/search", "/health", "/model"} <= set(schema["paths"])
    assert "PredictRequest" in schema["components"]["schemas"]
