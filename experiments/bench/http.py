"""Latency and throughput of the HTTP service, measured with a real load generator on loopback; and the helpers the
service's other benchmarks drive it with (experiments.bench.search_budget): a started server, a call, its memory.

    python -m experiments.bench.http [--requests 300] [--seconds 60] [--batch 2000]

Starts `python -m serve serve` on a free 127.0.0.1 port with the champion,
waits for its featurisation workers (started in the background), then
(bounded in count and in time) sends single-plan POST /predict requests one
after another from a client thread pool of --concurrency, records each round
trip, and reports p50 / p90 / p99. Then batched: POST /predict with
--batch plans per request, a few times, and reports plans per second.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from collect import REPO
from experiments.bench.request_cost import tree_rss
from serve.client import Client
from serve.schemas import SearchRequest
from serve.search.space import Space

WORKLOAD = json.loads((REPO / "experiments" / "requests" / "gpt-20l-1536.json").read_text())
CLUSTER = {"preset": "a100-80gb"}


def start_server(model: str) -> tuple[subprocess.Popen, Client]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "serve", "serve", "--port", str(port), "--model", model],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = Client(f"http://127.0.0.1:{port}")
    for _ in range(600):
        try:
            # steady state: the featurisation workers it starts in the background have imported torch
            if client.model().get("featurisation_workers_ready", 1) >= 1:
                return proc, client
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start (or its featurisation workers did not)")


class Watch:
    """The server tree's peak RSS above ``idle`` while a drill runs, sampled every 20 ms."""

    def __init__(self, pid: int, idle: int):
        self.pid, self.idle, self.peak, self._stop = pid, idle, idle, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, tree_rss(self.pid))

    def __enter__(self) -> "Watch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mib(self) -> float:
        return round((self.peak - self.idle) / 2**20, 1)


def call(base: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict, float]:
    """One request: (status, the JSON answered, seconds), errors included."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data, {"Content-Type": "application/json"}, method=method)
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=900) as r:
            return r.status, json.loads(r.read()), time.perf_counter() - t0
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), time.perf_counter() - t0


def finished(base: str, job_id: str) -> dict:
    while (job := call(base, "GET", f"/searches/{job_id}")[1])["state"] in ("queued", "running"):
        time.sleep(0.2)
    return job


def idle_after(base: str, since: float) -> float:
    """Seconds from ``since`` until nothing runs or waits."""
    while True:
        health = call(base, "GET", "/health")[1]
        slots = health["slots"]
        if health["requests_in_flight"] + sum(s["running"] + s["waiting"] for s in slots.values()) == 0:
            return round(time.perf_counter() - since, 2)
        time.sleep(0.02)


def hang_up(base: str, path: str, body: dict, after_s: float) -> float:
    """Send, hang up after ``after_s``, and the seconds until the server is idle again."""
    host, port = base.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    sock.sendall(head.encode() + data)
    time.sleep(after_s)
    sock.close()
    return idle_after(base, time.perf_counter())


def plans(n: int) -> list[dict]:
    request = SearchRequest.model_validate({"workload": WORKLOAD, "cluster": CLUSTER})
    specs = Space(request.workload, request.cluster.cluster()).enumerate()
    out = []
    while len(out) < n:  # the space's plans, repeated to the batch size; each carries its micro_batch_size
        out += [s for s in specs]
    return out[:n]


def latency(client: Client, requests: int, seconds: float, concurrency: int) -> dict:
    specs = plans(64)
    bodies = [({**WORKLOAD, "micro_batch_size": s.workload.micro_batch_size}, s.plan.model_dump()) for s in specs]
    for w, p in bodies[:5]:
        client.predict(w, CLUSTER, [p])  # warm-up

    def one(i: int) -> float:
        w, p = bodies[i % len(bodies)]
        t = time.perf_counter()
        client.predict(w, CLUSTER, [p])
        return time.perf_counter() - t

    times, deadline = [], time.monotonic() + seconds
    with ThreadPoolExecutor(concurrency) as pool:
        while len(times) < requests and time.monotonic() < deadline:
            times += list(pool.map(one, range(len(times), len(times) + concurrency)))
    ms = np.array(times) * 1e3
    return {
        "requests": len(ms),
        "concurrency": concurrency,
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }


def throughput(client: Client, batch: int, repeats: int) -> dict:
    by_mbs: dict[int, list[dict]] = {}
    for s in plans(batch):
        by_mbs.setdefault(s.workload.micro_batch_size, []).append(s.plan.model_dump())
    mbs, group = max(by_mbs.items(), key=lambda kv: len(kv[1]))  # one request = one workload
    group = (group * (batch // len(group) + 1))[:batch]
    seconds = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = client.predict({**WORKLOAD, "micro_batch_size": mbs}, CLUSTER, group)
        seconds.append(time.perf_counter() - t)
        assert len(out["predictions"]) == batch
    return {"batch": batch, "repeats": repeats, "seconds": seconds, "plans_per_s": batch / statistics.median(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models:/plansight@champion")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "bench_http.json"))
    args = parser.parse_args()
    proc, client = start_server(args.model)
    try:
        report = {
            "latency": latency(client, args.requests, args.seconds, args.concurrency),
            "throughput": throughput(client, args.batch, args.repeats),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    Path(args.out).write_text(json.dumps(report, indent=1))
    lat, thr = report["latency"], report["throughput"]
    print(
        f"single plan over HTTP: {lat['requests']} requests, p50 {lat['p50_ms']:.1f} ms, p90 {lat['p90_ms']:.1f} ms, "
        f"p99 {lat['p99_ms']:.1f} ms"
    )
    print(f"batched: {thr['batch']} plans per request, {thr['plans_per_s']:.0f} plans/s (median of {thr['repeats']})")


if __name__ == "__main__":
    main()
