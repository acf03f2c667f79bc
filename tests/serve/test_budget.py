"""Searches and /explain bounded and fair, against a real server (beside test_limits.py): a search's cost estimated
before any work and refused or stopped at its budget, searches and /explain in slots of their own so /predict
never waits behind them, every wait with a deadline, hang-ups and DELETEs that stop the work inside a batch; and
probes (gnn.inference.probe), which correct the service's times by a machine's runs (data/runs/probe-20261126T052518,
measured here: three plans and their fingerprint), checked before any work. Each case asserts its status and that
the server is idle again within IDLE_S. Timings are measured in experiments/bench/search_budget.py, not asserted
here."""

import json
import math
import socket
import subprocess
import sys
import time

import pytest

from collect.store import ResultStore
from experiments.bench.search_budget import ISSUE_SEARCH  # the 283-byte request of issue 52
from serve.client import PlansightError
from serve.search.budget import SEARCH
from tests.serve.conftest import CLUSTER, REPO, WORKLOAD, call, finished, start_server
from tests.serve.test_hostile import BIG_SEARCH

IDLE_S = 2.0  # what the issue asks of a stop: the work's own checks land every few hundred ms of it
# a background search that runs for minutes at the default budget: the explorer's Llama 70B at the trial limit
LONG_SEARCH = {
    "workload": json.loads((REPO / "experiments" / "requests" / "llama-3.1-70b.json").read_text()),
    "cluster": {"preset": "h100-80gb", "nodes": 4},
    "trials": 5000,
}
# one plan that takes seconds to take apart: a pipeline of 128 stages and 1,024 micro-batches
EXPLAIN = {
    "workload": {**WORKLOAD, "layers": 128, "global_batch_size": 1024},
    "cluster": {"preset": "h100-80gb", "nodes": 16},
    "plans": [{"pp": 128, "pp_schedule": "1f1b", "num_microbatches": 1024}],
}
PREDICT = {"workload": WORKLOAD, "cluster": CLUSTER, "plans": [{"dp": 4, "num_microbatches": 4}]}


def _idle(base: str, within_s: float = IDLE_S) -> dict:
    """/health once nothing runs or waits (asserting that happens within ``within_s``)."""
    deadline = time.monotonic() + within_s
    while True:
        status, health = call(base, "GET", "/health")
        assert status == 200, health
        slots = health["slots"]
        busy = health["requests_in_flight"] + health["searches_in_flight"]
        busy += sum(s["running"] + s["waiting"] for s in slots.values())
        if busy == 0:
            return health
        assert time.monotonic() < deadline, f"still busy {within_s} s on: {health}"
        time.sleep(0.05)


def _heavy(base: str, running: int, deadline_s: float = 60) -> None:
    """Wait until ``running`` heavy slots are taken (a bound on a hang, not a timing)."""
    deadline = time.monotonic() + deadline_s
    while call(base, "GET", "/health")[1]["slots"]["heavy"]["running"] < running:
        assert time.monotonic() < deadline, "the heavy slots never filled"
        time.sleep(0.05)


def _send(base: str, path: str, body: dict) -> socket.socket:
    """A request sent on a raw socket, its answer not read: closing the socket is the client hanging up."""
    host, port = base.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    sock.sendall(head.encode() + data)
    return sock


def _answer(sock: socket.socket) -> str:
    """The whole response to a request sent by _send: its headers, then as many bytes as they announce."""
    sock.settimeout(60)  # a bound on a hang, not a timing
    data = b""
    while b"\r\n\r\n" not in data and (chunk := sock.recv(4096)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next((line.split(b":")[1] for line in head.lower().split(b"\r\n") if line.startswith(b"content-length")), 0)
    )
    while len(body) < length and (chunk := sock.recv(4096)):
        body += chunk
    return (head + b"\r\n\r\n" + body).decode("latin-1")


@pytest.fixture
def base(server):
    yield server.base_url
    _idle(server.base_url, within_s=60)  # a test that failed half-way must not leave work behind for the next


@pytest.fixture(scope="module")
def strict(predictor_path):
    """A server whose requests wait at most 1 s for a slot and whose background searches stop after 10 s of
    estimated work."""
    proc, client = start_server(predictor_path, "--slot-wait", "1", "--job-budget", "10")
    yield client.base_url
    proc.terminate()
    proc.wait(timeout=30)


def test_a_search_over_its_budget_is_refused_with_its_estimate(base):
    status, body = call(base, "POST", "/search", ISSUE_SEARCH)
    assert status == 422, body
    (problem,) = body["detail"]
    assert problem["loc"] == ["body", "trials"] and problem["type"] == "search_over_budget"
    assert "estimated work" in problem["msg"] and f"budget of {SEARCH.seconds:.0f} s" in problem["msg"]
    assert "POST /searches" in problem["msg"]  # where it can run instead
    _idle(base)


def test_a_background_search_stops_at_its_budget_with_the_best_so_far(strict):
    status, job = call(strict, "POST", "/searches", ISSUE_SEARCH)
    assert status == 202, job
    assert job["budget"]["seconds"] == 10 and job["estimate"]["seconds"] > 10  # accepted: it will stop there
    done = finished(strict, job["id"])
    assert done["state"] == "done", done
    answer = done["response"]
    assert answer["stopped_by"] == "budget" and "budget of 10 s" in answer["stop_reason"]
    assert 0 < answer["trials"] < answer["space_size"] and answer["best"] and answer["space_size_exact"]
    # the 24 plans of pp 256 x 512 (and any others too costly for a search's memory) are left out, and counted
    assert answer["space_size"] + answer["over_budget_plans"] == 288 and answer["over_budget_plans"] >= 24
    assert all(r["plan"]["pp"] < 256 for r in answer["best"])
    _idle(strict)


def test_predict_answers_while_two_searches_hold_the_heavy_slots_and_a_delete_ends_each(base):
    jobs = [call(base, "POST", "/searches", {**LONG_SEARCH, "seed": seed})[1] for seed in (1, 2)]
    _heavy(base, 2)
    status, third = call(base, "POST", "/searches", LONG_SEARCH)  # read and queued without a heavy slot
    assert status == 202 and third["state"] == "queued"
    status, answer = call(base, "POST", "/predict", PREDICT)
    assert status == 200 and len(answer["predictions"]) == 1
    health = call(base, "GET", "/health")[1]
    assert health["slots"]["heavy"] == {"size": 2, "running": 2, "waiting": 1}
    for job in [*jobs, third]:
        assert call(base, "DELETE", f"/searches/{job['id']}")[0] == 200
    _idle(base)
    assert {finished(base, job["id"])["state"] for job in [*jobs, third]} == {"cancelled"}


def test_a_request_waiting_past_the_deadline_gets_503_with_retry_after(strict):
    jobs = [call(strict, "POST", "/searches", {**LONG_SEARCH, "seed": seed})[1] for seed in (1, 2)]
    try:
        _heavy(strict, 2)
        request = _send(strict, "/explain", EXPLAIN)  # waits for a heavy slot; 1 s at most
        answer = _answer(request).lower()
        request.close()
        assert answer.startswith("http/1.1 503") and "retry-after:" in answer and "no heavy slot" in answer, answer
        assert call(strict, "POST", "/predict", PREDICT)[0] == 200  # its own slots
    finally:
        for job in jobs:
            call(strict, "DELETE", f"/searches/{job['id']}")
    _idle(strict)


def test_a_request_whose_client_hangs_up_while_it_waits_leaves_the_queue(base):
    jobs = [call(base, "POST", "/searches", {**LONG_SEARCH, "seed": seed})[1] for seed in (1, 2)]
    try:
        _heavy(base, 2)
        request = _send(base, "/explain", EXPLAIN)
        deadline = time.monotonic() + 60
        while call(base, "GET", "/health")[1]["slots"]["heavy"]["waiting"] == 0:
            assert time.monotonic() < deadline, "the request never queued"
            time.sleep(0.05)
        request.close()
        deadline = time.monotonic() + IDLE_S
        while call(base, "GET", "/health")[1]["slots"]["heavy"]["waiting"]:
            assert time.monotonic() < deadline, "the hung-up request still waits"
            time.sleep(0.05)
    finally:
        for job in jobs:
            call(base, "DELETE", f"/searches/{job['id']}")
    _idle(base)


@pytest.mark.parametrize("path,body", [("/explain", EXPLAIN), ("/search", BIG_SEARCH)])
def test_a_hung_up_explain_or_search_stops_inside_its_work(base, path, body):
    request = _send(base, path, body)
    _heavy(base, 1)
    request.close()
    _idle(base)


# --- probes: checked before any work ----------------------------------------------------------------------------

PROBE = "probe-20261126T052518"
ROWS = ResultStore(REPO / "data" / "runs" / f"{PROBE}.parquet").load()
ROWS = ROWS[~ROWS["is_reference"].astype(bool)]  # each world size's reference plan, measured as in every sweep
FINGERPRINT = ROWS["fingerprint_id"].iloc[0]
PROBE_WORKLOAD = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 512, "micro_batch_size": 1,
            "global_batch_size": 4, "dtype": "float32"}  # fmt: skip
PROBE_CLUSTER = {"fingerprint": FINGERPRINT, "devices_per_node": 2, "memory_bytes": 2**30}
PROBE_PLANS = [{"dp": 2, "num_microbatches": 2}, {"dp": 1, "pp": 2, "num_microbatches": 4, "pp_schedule": "1f1b"}]


def _log_width(p: dict) -> float:
    lo, hi = p["iter_time_interval_s"]
    return math.log(hi / lo)


def test_a_probe_moves_every_time_by_its_factor_and_widens_the_intervals(server):
    plain = server.predict(PROBE_WORKLOAD, PROBE_CLUSTER, PROBE_PLANS)
    probed = server.predict(PROBE_WORKLOAD, PROBE_CLUSTER, PROBE_PLANS, probe=PROBE)
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
            server.predict(PROBE_WORKLOAD, PROBE_CLUSTER, PROBE_PLANS, probe=name)
        assert e.value.status == 422 and "probe" in json.dumps(e.value.detail)
    assert server.health()["status"] == "ok"


def _run(*args):
    return subprocess.run([sys.executable, "-m", "serve", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_the_shell_reports_a_probe_and_predicts_with_it(predictor_path, tmp_path):
    out = _run("probe", PROBE, "--model", str(predictor_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("measured") == 3 and f"--probe {PROBE}" in out.stdout
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"workload": PROBE_WORKLOAD, "cluster": PROBE_CLUSTER, "plans": PROBE_PLANS}))
    out = _run("predict", str(spec), "--model", str(predictor_path), "--probe", PROBE, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["probe"]["runs"] == 3
    bad = _run("predict", str(spec), "--model", str(predictor_path), "--probe", "missing")
    assert bad.returncode == 2 and "--probe" in bad.stderr and "missing" in bad.stderr


A100 = {"workload": WORKLOAD, "cluster": CLUSTER, "plans": PREDICT["plans"]}
STORED = sorted(p.name.removesuffix(".parquet") for p in (REPO / "data" / "runs").glob("*.parquet"))


def test_a_stored_sweep_named_as_a_probe_is_a_422_naming_probe(base):
    status, body = call(base, "POST", "/predict", {**A100, "probe": "cpu-v1"})
    assert status == 422, body
    assert "probe" in json.dumps(body["detail"]) and "more than a probe's 32" in json.dumps(body["detail"])
    _idle(base)


@pytest.mark.parametrize("name", STORED)
def test_every_stored_name_as_a_probe_is_answered_or_refused_naming_probe(base, name):
    status, body = call(base, "POST", "/predict", {**A100, "probe": name})
    assert status in (200, 422), body
    if status == 422:
        assert "probe" in json.dumps(body["detail"])
    else:
        assert body["probe"]["probe"] == name  # a probe of the request's own hardware
    _idle(base)


def test_a_probe_from_other_hardware_is_refused_unless_asked_for(base):
    status, body = call(base, "POST", "/predict", {**A100, "probe": "dlperf-v100"})
    assert status == 422 and "measured on v100" in json.dumps(body["detail"]), body
    status, body = call(base, "POST", "/predict", {**A100, "probe": "dlperf-v100", "probe_any_hardware": True})
    assert status == 200 and body["probe"]["runs"] == 18, body
    _idle(base)


def _predict_cli(*args: str) -> subprocess.CompletedProcess:
    return _run("predict", *args)


def test_the_shell_refuses_a_stored_sweep_as_a_probe_in_one_line(predictor_path, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(A100))
    flag = _predict_cli(str(spec), "--model", str(predictor_path), "--probe", "cpu-v1")
    assert flag.returncode == 2 and len(flag.stderr.strip().splitlines()) == 1, flag.stderr
    assert "--probe" in flag.stderr and "more than a probe's 32" in flag.stderr
    inline = tmp_path / "inline.json"
    inline.write_text(json.dumps({**A100, "probe": "cpu-v1"}))
    field = _predict_cli(str(inline), "--model", str(predictor_path))
    assert field.returncode == 2 and "Traceback" not in field.stderr and "probe" in field.stderr, field.stderr
