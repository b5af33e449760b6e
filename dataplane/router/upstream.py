"""HTTP/1.1 client side: keep-alive connections to pods, one asyncio Protocol each.

A ``Pool`` keeps idle connections per pod (LIFO, so the warmest socket is reused and the rest
age out after ``upstream_idle_keepalive_s``), bounded by ``max_idle_connections_per_pod``.
An ``UpstreamConnection`` parses the response with httptools and hands head, body chunks and
the end to a ``Sink`` (the proxy's exchange) synchronously, so a streamed chunk goes from the
pod's socket to the client's socket without a task switch.

The end of a response (RFC 9112 section 6.3): chunked and Content-Length bodies end where their
framing says, and a close before that is the pod lost. A body with neither ends when the pod
closes the connection (``ends_at_close``, asked only then, so it costs the hot path nothing): a
clean close (FIN) is that body's end, as complete as a chunked body's last chunk; a reset is
still the pod lost.

``fetch`` is a small one-shot client for the control plane, pod probes and wake calls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools

log = logging.getLogger("dataplane.router")


class Sink(Protocol):
    def upstream_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None: ...

    def upstream_body(self, data: bytes) -> None: ...

    def upstream_done(self) -> None: ...

    def upstream_lost(self, exc: BaseException | None) -> None: ...

    def upstream_flush(self) -> None: ...


class UpstreamConnection(asyncio.Protocol):
    def __init__(self, key: str) -> None:
        self.key = key  # pool key, "host:port"
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sink: Sink | None = None
        self.closed = False
        self.idle_since = 0.0  # monotonic s when returned to the pool
        self.keep_alive = True
        self.bytes_received = 0  # of the current response, bytes
        self.last_activity = 0.0  # monotonic s of the last byte from the pod (or of a resume)
        # Reading paused for a client that reads slower than the pod writes (backpressure): the
        # pod is not silent then, the router is not listening (``silent_s``).
        self.paused = False
        self.paused_since = 0.0  # monotonic s when reading was paused
        self.status = 0  # of the current response once its head is parsed, else 0
        self._headers: list[tuple[bytes, bytes]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        sink, self.sink = self.sink, None
        if sink is None:
            return
        if exc is None and self.status and ends_at_close(self.status, self._headers):
            sink.upstream_done()  # httptools has no end-of-input call: the clean close ends it here
        else:
            sink.upstream_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.bytes_received += len(data)
        self.last_activity = time.monotonic()
        if self.sink is None:  # bytes nobody asked for: the connection is not reusable
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if isinstance(exc, httptools.HttpParserCallbackError):  # our own code failed, not the pod
                log.error("handling a pod's answer failed", exc_info=exc.__context__)
            sink, self.sink = self.sink, None
            self.close()
            if sink is not None:
                sink.upstream_lost(exc)
            return
        if self.sink is not None:  # mid-response: push out what this read produced
            self.sink.upstream_flush()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()
            if not self.paused:
                self.paused, self.paused_since = True, time.monotonic()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()
            if self.paused:  # the pod's silence counts from when the router listens again
                self.paused, self.last_activity = False, time.monotonic()

    def silent_s(self, now: float) -> float:
        """Seconds the pod has been silent while the router read it: 0 while reading is paused
        (its client's backpressure: a stall of the client's, not the pod's)."""
        return 0.0 if self.paused else now - self.last_activity

    def send(self, data: bytes, sink: Sink) -> None:
        assert self.transport is not None
        self.sink = sink
        self.bytes_received = 0
        if self.paused:  # left paused by the last answer's client: this answer is read
            self.resume_reading()
        self.last_activity = time.monotonic()
        self.status = 0
        self._headers = []
        self.transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        self.status = self.parser.get_status_code()
        if self.sink is not None:
            self.sink.upstream_head(self.status, self._headers)

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink.upstream_body(body)

    def on_message_complete(self) -> None:
        sink, self.sink = self.sink, None
        if sink is not None:
            sink.upstream_done()


def ends_at_close(status: int, headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a response's body is delimited by the connection closing (RFC 9112 6.3): a status
    that has a body, and neither chunked as the final transfer coding nor a Content-Length (a
    Transfer-Encoding without chunked last also reads to the close). Only asked of responses to
    requests with a body allowed: the router sends pods no HEAD and no CONNECT."""
    if status < 200 or status in (204, 304):
        return False
    codings = b""
    length = False
    for name, value in headers:
        lower = name.lower()
        if lower == b"transfer-encoding":
            codings = value  # repeated: the last one holds the final coding
        elif lower == b"content-length":
            length = True
    if codings:
        return codings.rpartition(b",")[2].strip().lower() != b"chunked"
    return not length


def split_url(url: str) -> tuple[str, int]:
    """http://127.0.0.1:9001 -> ("127.0.0.1", 9001); only http:// (pods are on a private net)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"pod URL must be http://host:port, got {url!r}")
    return parts.hostname, parts.port or 80


class Pool:
    def __init__(self, connect_timeout_s: float, idle_timeout_s: float, max_idle_per_pod: int) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_idle_per_pod = max_idle_per_pod
        self._idle: dict[tuple[str, int], list[UpstreamConnection]] = {}
        self.active = 0  # connections lent out and not yet returned, count (0 when idle)

    async def acquire(self, host: str, port: int) -> tuple[UpstreamConnection, bool]:
        """A connection to host:port and whether it was reused from the pool."""
        idle = self._idle.get((host, port))
        if idle:
            now = time.monotonic()
            while idle:
                conn = idle.pop()
                if not conn.closed and now - conn.idle_since < self.idle_timeout_s:
                    self.active += 1
                    return conn, True
                conn.close()
        loop = asyncio.get_running_loop()
        key = f"{host}:{port}"
        _, proto = await asyncio.wait_for(
            loop.create_connection(lambda: UpstreamConnection(key), host, port), self.connect_timeout_s
        )
        self.active += 1
        return proto, False

    def release(self, host: str, port: int, conn: UpstreamConnection, reusable: bool) -> None:
        self.active -= 1
        if not reusable or conn.closed or not conn.keep_alive or conn.sink is not None:
            conn.close()
            return
        idle = self._idle.setdefault((host, port), [])
        if len(idle) >= self.max_idle_per_pod:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def sweep(self, now: float) -> None:
        """Close idle connections older than the idle timeout (called about once a second)."""
        for key, idle in list(self._idle.items()):
            keep = [c for c in idle if not c.closed and now - c.idle_since < self.idle_timeout_s]
            for c in idle:
                if c not in keep:
                    c.close()
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]

    def idle_count(self) -> int:
        return sum(len(v) for v in self._idle.values())

    def close_all(self) -> None:
        for idle in self._idle.values():
            for c in idle:
                c.close()
        self._idle.clear()


class _Collect:
    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def upstream_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}

    def upstream_body(self, data: bytes) -> None:
        self.chunks.append(data)

    def upstream_done(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def upstream_flush(self) -> None:
        pass

    def upstream_lost(self, exc: BaseException | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"connection lost: {exc!r}"))


async def fetch(
    url: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    timeout_s: float = 5.0,
) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection: (status, lower-case headers, body). Raises OSError,
    ConnectionError or TimeoutError."""
    parts = urlsplit(url)
    host, port = split_url(f"{parts.scheme}://{parts.netloc}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [
        f"{method} {path} HTTP/1.1",
        f"host: {parts.netloc}",
        "connection: close",
        f"content-length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    loop = asyncio.get_running_loop()

    async def go() -> tuple[int, dict[str, str], bytes]:
        _, conn = await loop.create_connection(lambda: UpstreamConnection(f"{host}:{port}"), host, port)
        sink = _Collect()
        try:
            conn.send(data, sink)
            await sink.done
        finally:
            conn.close()
        return sink.status, sink.headers, b"".join(sink.chunks)

    return await asyncio.wait_for(go(), timeout_s)
