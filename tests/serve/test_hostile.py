"""The service against a hostile client, over real HTTP on loopback: malformed fields, bodies that lie about
their size or stall, work without bound, clients that hang up, SIGTERM mid-search, and a schema-driven fuzzer.
Every answer is a 4xx naming the field and the rule, never a 5xx, and the server stays up."""

import http.client
import json
import math
import os
import random
import signal
import socket
import time
import urllib.request
from urllib.parse import urlparse

import pytest

from serve.client import PlansightError
from tests.serve.conftest import CLIENT_TIMEOUT_S, CLUSTER, WORKLOAD, start_server

PLAN = {"dp": 4, "num_microbatches": 4}
FUZZ_CASES = 600
BIG_SEARCH = {  # a synchronous search estimated just under its budget (serve.search.budget.SEARCH): seconds of work
    "workload": {**WORKLOAD, "layers": 32, "global_batch_size": 4096},
    "cluster": {"preset": "h100-80gb", "nodes": 4},
    "trials": 300,
}


def _post_raw(server, path: str, data: bytes) -> tuple[int, bytes]:
    url = urlparse(server.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _post(server, path: str, body) -> tuple[int, dict]:
    status, payload = _post_raw(server, path, json.dumps(body, allow_nan=True).encode())
    return status, json.loads(payload)


def _socket(server) -> socket.socket:
    url = urlparse(server.base_url)
    return socket.create_connection((url.hostname, url.port), timeout=30)


@pytest.mark.parametrize("value", ["two", None, [2], {"pp": 2}, 2.5, True, -3, 10**30])
def test_a_degree_of_any_wrong_type_is_422_naming_it(server, value):
    status, body = _post(
        server, "/predict", {"workload": WORKLOAD, "cluster": CLUSTER, "plans": [{**PLAN, "dp": 1, "pp": value}]}
    )
    assert status == 422, body
    assert ["body", "plans", 0, "pp"] in [e["loc"] for e in body["detail"]] or "plan.pp" in json.dumps(body)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_422_and_the_answer_is_valid_json(server, value):
    status, body = _post(
        server, "/predict", {"workload": {**WORKLOAD, "layers": value}, "cluster": CLUSTER, "plans": [PLAN]}
    )
    assert status == 422 and body["detail"][0]["loc"] == ["body", "workload", "layers"]


def test_an_unknown_fingerprint_is_422_naming_where_fingerprints_are_looked_up(server):
    for name in ("vm-20990101T000000", "../../etc/passwd"):
        cluster = {"fingerprint": name, "devices_per_node": 4, "memory_bytes": 2**34}
        status, body = _post(server, "/predict", {"workload": WORKLOAD, "cluster": cluster, "plans": [PLAN]})
        assert status == 422, body
        detail = json.dumps(body)
        assert name in detail and "/work" not in detail and "/tmp" not in detail  # no server paths


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"micro_batch_sizes": [0]}, "micro_batch_sizes"),
        ({"micro_batch_sizes": [-1]}, "micro_batch_sizes"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**32}, "seed"),
    ],
)
def test_bad_search_options_are_422(server, extra, field):
    status, body = _post(server, "/search", {"workload": WORKLOAD, "cluster": CLUSTER, "trials": 5, **extra})
    assert status == 422 and body["detail"][0]["loc"][:2] == ["body", field]


def test_a_422_names_the_field_and_rule_without_echoing_the_body(server):
    plans = [PLAN] * 9_000 + [{"dp": 4, "num_microbatches": 3}]
    status, payload = _post_raw(
        server, "/predict", json.dumps({"workload": WORKLOAD, "cluster": CLUSTER, "plans": plans}).encode()
    )
    assert status == 422 and b"plans[9000]" in payload and len(payload) < 2_000


def test_a_plan_past_the_work_limits_is_refused_at_once(server):
    workload = {**WORKLOAD, "layers": 1024, "global_batch_size": 1024}
    cluster = {"preset": "a100-80gb", "nodes": 128}
    status, body = _post(
        server,
        "/predict",
        {"workload": workload, "cluster": cluster, "plans": [{"pp": 1024, "num_microbatches": 1024}]},
    )
    assert status == 422 and "1024 pipeline stages is over the limit of 256" in json.dumps(body)


def test_a_chunked_body_is_counted_as_it_arrives(server):
    sock = _socket(server)
    sock.sendall(
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk, sent = b"[" * 2**16, 0
    try:
        while sent < 24 * 2**20:
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
    except OSError:
        pass  # the server answered and closed before taking it all: what should happen
    assert sock.recv(64).startswith(b"HTTP/1.1 413")
    sock.close()
    assert server.health()["status"] == "ok"


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /predict HTTP/1.1\r\nHost: x\r\n",  # headers never finish
        b'POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"wo',
        b"",
    ],
)  # connects, sends nothing
def test_a_stalled_connection_is_closed(server, request_bytes):
    sock = _socket(server)
    sock.sendall(request_bytes)
    sock.settimeout(10 * CLIENT_TIMEOUT_S)  # a bound on a hang, not a timing: the server closes after 2 s
    received = b""
    while chunk := sock.recv(4096):
        received += chunk
    assert received == b"" or received.startswith(b"HTTP/1.1 408")
    sock.close()


def _search_in_flight(server, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    sock = _socket(server)
    sock.sendall(
        b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
    )
    deadline = time.monotonic() + 60
    while server.health()["searches_in_flight"] == 0:
        assert time.monotonic() < deadline, "the search never started"
        time.sleep(0.2)
    return sock


def test_a_search_stops_when_its_client_hangs_up(server):
    _search_in_flight(server, BIG_SEARCH).close()
    deadline = time.monotonic() + 60  # bounds a hang; a batch takes well under a second
    while server.health()["searches_in_flight"]:
        assert time.monotonic() < deadline, "the search went on after its client left"
        time.sleep(0.2)


def test_sigterm_stops_the_server_mid_search(predictor_path):
    proc, client = start_server(predictor_path)
    try:
        sock = _search_in_flight(client, BIG_SEARCH)
        proc.send_signal(signal.SIGTERM)
        answer = sock.recv(4096).decode("latin-1").lower()  # the request in flight is told, not cut off
        assert answer.startswith("http/1.1 503") and "retry-after:" in answer, answer
        assert proc.wait(timeout=60) is not None  # a bound on a hang, not a timing
        sock.close()
    finally:
        if proc.poll() is None:
            proc.kill()


# --- the fuzzer: every field the OpenAPI schema names, given values of every wrong kind ----------------------

WRONG_VALUES = [
    "",
    "x" * 10_000,
    "\udcff",
    None,
    True,
    -1,
    0,
    2**63,
    10**40,
    1.5,
    -0.0,
    math.nan,
    math.inf,
    [],
    [1, "a"],
    {},
    {"a": {"b": {"c": []}}},
    "1e400",
    "\u0000",
    [[[[[[[[[[[]]]]]]]]]]],
]


def _fields(schema: dict, components: dict, path: tuple = (), depth: int = 0):
    """(path, subschema) for every property reachable from ``schema``, $refs resolved."""
    if "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[1]]
    for option in schema.get("anyOf", []) + schema.get("allOf", []):
        yield from _fields(option, components, path, depth)
    if depth > 4:
        return
    for name, sub in schema.get("properties", {}).items():
        yield path + (name,), sub
        yield from _fields(sub, components, path + (name,), depth + 1)
    if "items" in schema and isinstance(schema["items"], dict):
        yield from _fields(schema["items"], components, path + (0,), depth + 1)


def _set(body, path: tuple, value, delete: bool = False):
    body = json.loads(json.dumps(body))
    node = body
    for key in path[:-1]:
        if isinstance(node, dict):
            node = node.setdefault(key, {})
        elif isinstance(node, list) and node:
            node = node[0]
        else:
            return body
    if isinstance(node, dict):
        node.pop(path[-1], None) if delete else node.__setitem__(path[-1], value)
    elif isinstance(node, list) and node and not delete:
        node[0] = value
    return body


def _cases(openapi: dict, rng: random.Random):
    components = openapi["components"]["schemas"]
    valid = {
        "/predict": {"workload": WORKLOAD, "cluster": CLUSTER, "plans": [PLAN]},
        "/search": {"workload": WORKLOAD, "cluster": CLUSTER, "trials": 3},
        "/searches": {"workload": WORKLOAD, "cluster": CLUSTER, "trials": 3},
        "/explain": {"workload": WORKLOAD, "cluster": CLUSTER, "plans": [PLAN]},
        # twelve plans: over POST /verify's budget, so the fuzz reaches its validation and its refusal, and no
        # mutation starts minutes of traces (tests/serve/verify runs them)
        "/verify": {"workload": WORKLOAD, "cluster": CLUSTER, "plans": [PLAN] * 12},
    }
    targets = {
        path: list(_fields(ops["post"]["requestBody"]["content"]["application/json"]["schema"], components))
        for path, ops in openapi["paths"].items()
        if "post" in ops
    }
    assert set(targets) == set(valid) and all(targets.values())
    for _ in range(FUZZ_CASES):
        path = rng.choice(sorted(targets))
        field, _ = rng.choice(targets[path])
        kind = rng.random()
        if kind < 0.8:
            body = _set(valid[path], field, rng.choice(WRONG_VALUES))
        elif kind < 0.9:
            body = _set(valid[path], field, None, delete=True)
        else:
            body = _set(valid[path], ("surprise",) if rng.random() < 0.5 else field + ("surprise",), 1)
        yield path, field, json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    for raw in (b"\xff\xfe{\x00}\x00", "{}".encode("utf-16"), b"[" * 100_000, b"1" * 5_000, b"null", b"{}"):
        yield "/predict", ("(raw)",), raw


def test_fuzzing_every_field_of_the_schema_gives_no_5xx(server):
    with urllib.request.urlopen(server.base_url + "/openapi.json", timeout=30) as response:
        openapi = json.loads(response.read())
    statuses, jobs = {}, []
    for path, field, data in _cases(openapi, random.Random(int(os.environ.get("FUZZ_SEED", 0)))):
        status, payload = _post_raw(server, path, data)
        assert status < 500, (path, field, data[:200], payload[:500])
        statuses[status] = statuses.get(status, 0) + 1
        if path == "/searches" and status == 202:
            jobs.append((json.loads(payload)["id"], data[:200]))
    assert statuses.get(422, 0) > FUZZ_CASES // 2, statuses  # most cases are invalid, and said to be
    for job, data in jobs:  # the background searches it started: finished, or refused saying why, never broken
        while (state := _job(server, job))["state"] in ("queued", "running"):
            time.sleep(0.1)
        assert state["state"] == "done" or state["error"][0]["type"] != "internal", (data, state["error"])
    assert server.health()["status"] == "ok"


def _job(server, job: str) -> dict:
    with urllib.request.urlopen(f"{server.base_url}/searches/{job}", timeout=30) as response:
        return json.loads(response.read())


def test_the_client_sees_a_422_as_an_error_naming_the_field(server):
    with pytest.raises(PlansightError) as e:
        server.predict(WORKLOAD, CLUSTER, [{**PLAN, "tp": "two"}])
    assert e.value.status == 422 and e.value.detail[0]["loc"][-1] == "tp"
