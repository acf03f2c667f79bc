"""A small Python client for the plansight service (standard library only).

from serve.client import Client
client = Client("http://127.0.0.1:8000")
client.predict(workload={...}, cluster={"preset": "a100-80gb", "nodes": 2}, plans=[{...}, ...])
client.search(workload={...}, cluster={...}, objective="time", trials=200)
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse

# a kept-alive connection the server closed while idle: send the request again on a fresh one
STALE = (http.client.RemoteDisconnected, http.client.CannotSendRequest, ConnectionResetError, BrokenPipeError)


class PlansightError(RuntimeError):
    def __init__(self, status: int, detail):
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail = status, detail


class Client:
    """Keeps one HTTP/1.1 connection per thread alive: a new TCP connection per request costs ~1 ms on loopback,
    a tenth of a single prediction."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", timeout: float = 60.0):
        self.base_url, self.timeout = base_url.rstrip("/"), timeout
        url = urllib.parse.urlsplit(self.base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"base_url {base_url!r}: expected http://host[:port] or https://host[:port]")
        self._url, self._local = url, threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            kind = http.client.HTTPSConnection if self._url.scheme == "https" else http.client.HTTPConnection
            conn = self._local.conn = kind(self._url.hostname, self._url.port, timeout=self.timeout)
        return conn

    def _drop_connection(self) -> None:
        conn, self._local.conn = getattr(self._local, "conn", None), None
        if conn is not None:
            conn.close()

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for attempt in (1, 2):
            reused = getattr(self._local, "conn", None) is not None
            try:
                conn = self._connection()
                conn.request(method, self._url.path + path, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                break
            except STALE:
                self._drop_connection()
                if not reused or attempt == 2:
                    raise
            except BaseException:
                self._drop_connection()  # a half-read response would poison the next request
                raise
        if resp.will_close:
            self._drop_connection()
        if resp.status >= 400:
            try:
                detail = json.loads(payload).get("detail")
            except (ValueError, AttributeError):
                detail = resp.reason
            raise PlansightError(resp.status, detail)
        return json.loads(payload)

    def health(self) -> dict:
        return self._call("GET", "/health")

    def model(self) -> dict:
        return self._call("GET", "/model")

    def predict(self, workload: dict, cluster: dict, plans: list[dict], probe: str | None = None) -> dict:
        """``probe``: a probe measured on the machine (python -m collect probe), to correct the times by."""
        body = {"workload": workload, "cluster": cluster, "plans": plans} | ({"probe": probe} if probe else {})
        return self._call("POST", "/predict", body)

    def verify(self, workload: dict, cluster: dict, plans: list[dict]) -> dict:
        """The plans traced under fake tensors beside their predictions (minutes: give the client a long timeout)."""
        return self._call("POST", "/verify", {"workload": workload, "cluster": cluster, "plans": plans})

    def search(self, workload: dict, cluster: dict, **options) -> dict:
        return self._call("POST", "/search", {"workload": workload, "cluster": cluster, **options})
