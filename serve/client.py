"""A small Python client for the plansight service (standard library only).

    from serve.client import Client
    client = Client("http://127.0.0.1:8000")
    client.predict(workload={...}, cluster={"preset": "a100-80gb", "nodes": 2}, plans=[{...}, ...])
    client.search(workload={...}, cluster={...}, objective="time", trials=200)
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request


class PlansightError(RuntimeError):
    def __init__(self, status: int, detail):
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail = status, detail


class Client:
    def __init__(self, base_url: str = "http://127.0.0.1:8000", timeout: float = 60.0):
        self.base_url, self.timeout = base_url.rstrip("/"), timeout

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read()).get("detail")
            except ValueError:
                detail = e.reason
            raise PlansightError(e.code, detail) from None

    def health(self) -> dict:
        return self._call("GET", "/health")

    def model(self) -> dict:
        return self._call("GET", "/model")

    def predict(self, workload: dict, cluster: dict, plans: list[dict]) -> dict:
        return self._call("POST", "/predict", {"workload": workload, "cluster": cluster, "plans": plans})

    def search(self, workload: dict, cluster: dict, **options) -> dict:
        return self._call("POST", "/search", {"workload": workload, "cluster": cluster, **options})
