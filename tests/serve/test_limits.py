"""Requests at the edges of every documented limit, alone and combined, against a real server: each is refused
before any work or answered within the request budget, and /health answers throughout. The cost estimate the
refusals rest on (gnn.inference.cost) counts exactly the passes featurisation builds."""

import json
import select
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

import optuna
import pytest

from collect.schema import Cluster, Plan, Workload
from collect.schema.plan import MAX_DEGREE
from collect.schema.workload import MAX_HEADS, MAX_LAYERS, MAX_TOKENS
from experiments.bench.request_cost import tree_rss
from gnn.costs.hardware import hardware_model
from gnn.inference.cost import CHUNK_BYTES, REQUEST_SECONDS, graph_passes, nodes_per_pass, plan_cost, request_cost
from gnn.inference.workers import CHUNK, chunk_bounds
from gnn.sim import plan as sim_plan
from serve.guard import BODY_DEADLINE_CHUNKS
from serve.schemas import MAX_MICROBATCHES, MAX_PLANS
from tests.serve.conftest import CLIENT_TIMEOUT_S, CLUSTER, REPO, WORKLOAD, start_server
from tests.serve.test_hostile import _post_raw

H100 = {"preset": "h100-80gb", "nodes": 32}  # 256 GPUs
GPT = {**WORKLOAD, "layers": 256}


def _pp(pp: int, microbatches: int, **plan) -> dict:
    return {"pp": pp, "dp": 256 // pp, "num_microbatches": microbatches, **plan}


def _request(plans: list[dict], workload: dict | None = None, cluster: dict | None = None) -> dict:
    workload = workload or GPT
    mb = plans[0]["num_microbatches"] * plans[0].get("dp", 1)
    return {"workload": {**workload, "global_batch_size": mb}, "cluster": cluster or H100, "plans": plans}


EDGES = {  # name: (path, body); every value inside the documented limits, or just over one
    "pp 256 x 1,024 micro-batches": ("/predict", _request([_pp(256, 1024)])),
    "2 plans of pp 256 x 512": ("/predict", _request([_pp(256, 512)] * 2)),
    "1 plan of pp 128 x 256": ("/predict", _request([_pp(128, 256)])),
    "16 plans of pp 128 x 256": ("/predict", _request([_pp(128, 256)] * 16)),
    "128 plans of pp 64 x 128": ("/predict", _request([_pp(64, 128)] * 128)),
    "10,000 plans of pp 16 x 26": ("/predict", _request([_pp(16, 26)] * MAX_PLANS)),
    "10,000 plans without a pipeline": ("/predict", _request([_pp(1, 1)] * MAX_PLANS)),
    "65,536 accumulated micro-batches": ("/predict", _request([_pp(1, MAX_MICROBATCHES)])),
    "interleaved, 256 stages": (
        "/predict",
        _request([_pp(128, 128, pp_schedule="interleaved_1f1b", virtual_stages=2)]),
    ),
    "split by weights, 10,000 layers": (
        "/predict",
        _request([_pp(8, 16, pipeline_split="weights")], {**WORKLOAD, "layers": MAX_LAYERS}),
    ),
    "layers 10**8, split by weights": (
        "/predict",
        _request([_pp(8, 16, pipeline_split="weights")], {**WORKLOAD, "layers": 10**8}),
    ),
    "16,384 heads, vocabulary 2**24": (
        "/predict",
        _request([_pp(1, 1)], {**WORKLOAD, "heads": MAX_HEADS, "hidden": MAX_HEADS * 4, "vocab": MAX_TOKENS}),
    ),
    "pp 2**20": ("/predict", _request([{"pp": MAX_DEGREE, "num_microbatches": 1}])),
    "hf_config of 3e8 heads": (
        "/predict",
        {
            "workload": {
                "hf_config": {
                    "architectures": ["LlamaForCausalLM"],
                    "num_attention_heads": 300_000_000,
                    "head_dim": [0],
                    "hidden_size": 4096,
                    "num_hidden_layers": 32,
                    "vocab_size": 128256,
                    "intermediate_size": 14336,
                },
                "seq_len": 4096,
                "micro_batch_size": 1,
                "global_batch_size": 8,
            },
            "cluster": {"preset": "h100-80gb", "nodes": 1},
            "plans": [{"dp": 8}],
        },
    ),  # fmt: skip
    "exhaustive search of 16,384 GPUs, 5 trials": (
        "/search",
        {
            "workload": {**GPT, "global_batch_size": 2**15},
            "cluster": {"preset": "h100-80gb", "nodes": 2048},
            "micro_batch_sizes": list(range(1, 17)),
            "sampler": "exhaustive",
            "trials": 5,
        },
    ),
    "search of 64 H100s, 64 trials": (
        "/search",
        {"workload": {**GPT, "global_batch_size": 512}, "cluster": {"preset": "h100-80gb", "nodes": 8}, "trials": 64},
    ),
}


@pytest.fixture(scope="module")
def measured_server(predictor_path):
    proc, client = start_server(predictor_path)
    yield proc, client
    proc.terminate()
    proc.wait(timeout=30)


def _health_watch(client, stop: threading.Event, latencies: list[float]) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        client.health()
        latencies.append(time.perf_counter() - t0)
        stop.wait(0.05)


def _rss_watch(pid: int, stop: threading.Event, peak: list[int]) -> None:
    while not stop.wait(0.02):
        peak.append(tree_rss(pid))


def test_every_edge_is_refused_at_once_or_answered_within_the_budget(measured_server, record_property):
    proc, client = measured_server
    report = []
    for name, (path, body) in EDGES.items():
        idle = tree_rss(proc.pid)
        peak, latencies, stop = [idle], [], threading.Event()
        watchers = [
            threading.Thread(target=_health_watch, args=(client, stop, latencies)),
            threading.Thread(target=_rss_watch, args=(proc.pid, stop, peak)),
        ]
        for w in watchers:
            w.start()
        t0 = time.perf_counter()
        status, payload = _post_raw(client, path, json.dumps(body).encode())
        seconds = time.perf_counter() - t0
        stop.set()
        for w in watchers:
            w.join()
        row = {
            "request": name,
            "status": status,
            "seconds": round(seconds, 2),
            "peak_mib_above_idle": round((max(peak) - idle) / 2**20),
            "health_max_ms": round(1000 * max(latencies, default=0.0), 1),
        }
        report.append(row)
        assert status in (200, 413, 422), (name, status, payload[:300])
        assert len(payload) < 64_000 or status == 200, name  # a refusal echoes no request back
        # a blocked event loop shows as /health waiting seconds; a thread scheduled late on a busy machine, not
        assert row["health_max_ms"] < 1000, row
        if status != 200:
            assert seconds < 5, row  # refused before any work: the estimate is arithmetic on the fields
    record_property("limits", report)
    print("\n" + "\n".join(json.dumps(r) for r in report))
    answered = {r["request"] for r in report if r["status"] == 200}
    assert {"1 plan of pp 128 x 256", "10,000 plans without a pipeline", "search of 64 H100s, 64 trials"} <= answered
    refused = {r["request"] for r in report if r["status"] != 200}
    assert {"pp 256 x 1,024 micro-batches", "16 plans of pp 128 x 256", "10,000 plans of pp 16 x 26"} <= refused
    assert {"layers 10**8, split by weights", "pp 2**20", "exhaustive search of 16,384 GPUs, 5 trials"} <= refused


def test_every_answered_edge_is_estimated_within_the_budget():
    """What the server answers, it answers because the estimate is inside the budget: the same arithmetic."""
    plan = Plan(pp=128, dp=2, pp_schedule="1f1b", num_microbatches=256)
    assert request_cost([plan]).seconds <= REQUEST_SECONDS
    assert request_cost([Plan(pp=16, dp=16, pp_schedule="1f1b", num_microbatches=26)] * MAX_PLANS).seconds > 10


@pytest.mark.parametrize(
    "pp,virtual,microbatches,schedule",
    [(1, 1, 1, None), (1, 1, 64, None), (4, 1, 3, "gpipe"), (4, 1, 40, "1f1b"), (8, 2, 64, "interleaved_1f1b")],
)
def test_the_estimate_counts_the_passes_featurisation_builds(monkeypatch, pp, virtual, microbatches, schedule):
    built = []
    real = sim_plan.build_graph
    monkeypatch.setattr(sim_plan, "build_graph", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    w = Workload(layers=16, hidden=64, heads=2, seq_len=32, vocab=128, micro_batch_size=1,
                 global_batch_size=microbatches)  # fmt: skip
    plan = Plan(pp=pp, pp_schedule=schedule, virtual_stages=virtual, num_microbatches=microbatches)
    cluster = Cluster(devices_per_node=pp, memory_bytes=2**30)
    sim_plan.simulate_plan(w, plan, cluster, hardware_model("a100-80gb", "data/hardware"))
    assert list(graph_passes(plan)) == [len(g.passes.start) for g in built]


MOE = Workload(family="moe", layers=16, hidden=256, heads=8, kv_heads=2, seq_len=256, vocab=1024, micro_batch_size=1,
               global_batch_size=64, experts=8, top_k=2, expert_ffn_hidden=512, dtype="bfloat16")  # fmt: skip
DENSE = Workload(family="llama", layers=16, hidden=256, heads=8, kv_heads=2, ffn_hidden=512, seq_len=256, vocab=1024,
                 micro_batch_size=1, global_batch_size=64, dtype="bfloat16")  # fmt: skip


LAYOUTS = [(moe, tp, cp, 1) for moe in (False, True) for tp, cp in ((1, 1), (4, 1), (1, 4), (4, 4))]


@pytest.mark.parametrize("moe,tp,cp,ep", LAYOUTS + [(True, 1, 1, 4), (True, 4, 4, 4)])
@pytest.mark.parametrize("sharding,recompute", [("none", "none"), ("zero1", "selective"), ("fsdp_full", "full")])
def test_the_estimate_bounds_the_nodes_of_a_pass_closely(moe, tp, cp, ep, sharding, recompute):
    """A graph's cost is priced per node: nodes_per_pass must not undercount any parallelism's nodes (a request
    would then run past its estimate, as mixture-of-experts plans did at 1.7x), nor price them far above."""
    plan = Plan(pp=4, dp=max(ep // cp, 1), tp=tp, cp=cp, ep=ep, sharding=sharding, recompute=recompute,
                pp_schedule="1f1b", num_microbatches=8, sequence_parallel=tp > 1)  # fmt: skip
    world = plan.pp * plan.dp * tp * cp
    cluster = Cluster(nodes=max(world // 8, 1), devices_per_node=min(world, 8), device="cuda",
                      device_kind="h100-80gb", memory_bytes=80 * 2**30, backend="nccl")  # fmt: skip
    w = (MOE if moe else DENSE).model_copy(update={"global_batch_size": 8 * plan.dp})
    graph = sim_plan.build_graph(w, plan, cluster, hardware_model("h100-80gb", "data/hardware"))
    built = graph.num_nodes / len(graph.passes.start)
    assert built <= nodes_per_pass(plan) <= 1.35 * built, (built, nodes_per_pass(plan))


def test_a_chunk_of_big_graphs_holds_few_of_them():
    plans = [Plan(pp=64, pp_schedule="1f1b", num_microbatches=128)] * 20 + [Plan()] * 200
    specs = [type("Spec", (), {"plan": p})() for p in plans]
    bounds = chunk_bounds(specs)
    assert [b - a for a, b in bounds][:3] != [CHUNK] * 3  # the big plans are not 64 to a chunk
    for a, b in bounds:
        cost = request_cost(plans[a:b])
        assert b - a == 1 or cost.chunk_bytes <= CHUNK_BYTES
        assert b - a <= CHUNK
    assert sum(b - a for a, b in bounds) == len(plans) and plan_cost(plans[-1]).plans == 1


def test_a_trickled_body_is_dropped_at_its_deadline(measured_server):
    """Each byte in time for the chunk timeout, the whole body not: 408 once the body's deadline passes."""
    _, client = measured_server
    url = urlparse(client.base_url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        deadline = time.monotonic() + BODY_DEADLINE_CHUNKS * CLIENT_TIMEOUT_S + 30  # bounds a server that never drops
        answer = b""
        while time.monotonic() < deadline and not answer:
            try:
                sock.sendall(b" ")
            except OSError:
                break  # closed after answering
            ready, _, _ = select.select([sock], [], [], CLIENT_TIMEOUT_S / 2)
            if ready:
                answer = _to_the_close(sock)
    assert answer.startswith(b"HTTP/1.1 408") and b"longer than" in answer, answer


def _to_the_close(sock: socket.socket) -> bytes:
    """What the server sends until it closes (its 408 says connection: close): headers and body can come in
    separate segments, and one recv may see only the first."""
    sock.settimeout(30)
    answer = b""
    while chunk := sock.recv(4096):
        answer += chunk
    return answer


def test_two_searches_on_one_study_share_it(predictor_path, tmp_path):
    """Two `serve search` processes on one sqlite study: both finish, no trial is left running, and the trials add
    up to the budget (each counts what is left every round)."""
    request = tmp_path / "search.json"
    body = {"workload": {**WORKLOAD, "global_batch_size": 64}, "cluster": CLUSTER, "trials": 48, "sampler": "optuna"}
    request.write_text(json.dumps(body))
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    cmd = [sys.executable, "-m", "serve", "search", str(request), "--model", str(predictor_path), "--storage", storage]
    procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    (name,) = optuna.get_all_study_names(storage)
    states = [t.state for t in optuna.load_study(study_name=name, storage=storage).trials]
    assert optuna.trial.TrialState.RUNNING not in states
    finished = [s for s in states if s in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert 48 <= len(finished) <= 48 + 2 * 32  # the budget, and at most a batch more from each
