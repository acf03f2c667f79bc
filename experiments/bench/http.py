"""Latency and throughput of the HTTP service, measured with a real load generator on loopback.

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
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from collect import REPO
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
