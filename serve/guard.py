"""What stands between the network and the service: requests bounded in bytes and in time.

Plain ASGI (@app.middleware("http") builds Starlette's BaseHTTPMiddleware, which
streams every response through a task group, ~1 ms of a single-plan request).
The whole body is read here before the app sees it, counting the bytes that
arrive (a chunked body has no Content-Length to trust) and giving each chunk
BODY_CHUNK_TIMEOUT_S to arrive and the whole body BODY_DEADLINE_CHUNKS times
that: over the limit is 413, a stalled or trickling client 408, and in both
cases the connection is closed. HeaderDeadline does the same for
a client that never finishes its request headers.
"""

from __future__ import annotations

import asyncio

from starlette.responses import JSONResponse
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_BODY_BYTES = 8 * 2**20
BODY_CHUNK_TIMEOUT_S = 10.0  # a client may be slow; one that sends nothing for this long has gone or stalled
# and the whole body must be in within this many chunk timeouts (30 s by default: 8 MiB at 300 kB/s), so a
# client trickling a byte every few seconds is dropped too
BODY_DEADLINE_CHUNKS = 3


class BodyGuard:
    def __init__(self, app, max_body_bytes: int = MAX_BODY_BYTES, chunk_timeout_s: float = BODY_CHUNK_TIMEOUT_S):
        self.app, self.max_body_bytes, self.chunk_timeout_s = app, max_body_bytes, chunk_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", ())).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_body_bytes:
            return await self._refuse(scope, receive, send, 413, self._too_large(length.decode("latin-1")))
        body, problem = await self._read(receive)
        if problem is not None:
            return await self._refuse(scope, receive, send, *problem)
        return await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive) -> tuple[bytes, tuple[int, str] | None]:
        chunks, size = [], 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BODY_DEADLINE_CHUNKS * self.chunk_timeout_s
        while True:
            left = deadline - loop.time()
            try:
                message = await asyncio.wait_for(receive(), min(self.chunk_timeout_s, max(left, 0.0)))
            except asyncio.TimeoutError:
                if left <= self.chunk_timeout_s:  # a trickle: each chunk in time, the whole body not
                    whole = BODY_DEADLINE_CHUNKS * self.chunk_timeout_s
                    return b"", (408, f"the request body took longer than {whole:.0f} s to arrive ({size} bytes)")
                return b"", (408, f"the request body stalled: nothing arrived for {self.chunk_timeout_s:.0f} s")
            if message["type"] == "http.disconnect":
                return b"", (400, "the client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return b"", (413, self._too_large(f"at least {size}"))
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None

    def _too_large(self, size: str) -> str:
        return f"request body of {size} bytes is over the limit of {self.max_body_bytes} bytes"

    async def _refuse(self, scope, receive, send, status: int, detail: str):
        response = JSONResponse(status_code=status, content={"detail": detail}, headers={"Connection": "close"})
        await response(scope, receive, send)


def _replay(body: bytes, receive):
    """A receive() that hands the app the body already read, then waits on the real one (for disconnects)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class HeaderDeadline(HttpToolsProtocol):
    """uvicorn's HTTP protocol, closing a connection whose request headers are not all in within
    ``header_timeout_s`` of the connection opening (or of the request starting on a kept-alive one): uvicorn
    itself waits for ever on a client that opens a connection and sends half a request line."""

    header_timeout_s = BODY_CHUNK_TIMEOUT_S
    _deadline = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.header_timeout_s, self._overdue)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _overdue(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def with_timeouts(timeout_s: float) -> tuple[type[HeaderDeadline], float]:
    """The protocol class and body-chunk timeout for a service that gives clients ``timeout_s`` to send."""
    protocol = type("HeaderDeadline", (HeaderDeadline,), {"header_timeout_s": timeout_s})
    return protocol, timeout_s
