"""Forward one request to one pod and stream the answer back: the exchange between sockets.

``Exchange`` is the sink of an upstream connection: the pod's response head becomes the client's
response head (hop-by-hop headers dropped, framing redone), each body chunk is written to the
client as it arrives (SSE events pass through one by one, no buffering), and the last 2 KiB of
the body are kept to read ``usage`` (prompt/completion tokens) for exact metering.

Failure semantics (the caller retries on ``UpstreamFailed(before_response=True)`` only):
  connect refused / timed out, or the connection lost before any response byte
      -> nothing reached the client: safe to try another pod;
  lost after the head was sent -> the client's connection is cut (a truncated stream is
      detectable, a spliced one from another pod would not be): never retried.
A body the pod delimits by closing the connection (no Content-Length, not chunked; RFC 9112
section 6.3) ends cleanly at that close (``upstream_done``, see ``upstream``): the client gets
it re-framed, chunked (or close-delimited to an HTTP/1.0 client), and its usage is read from
the tail as for any other body; only a reset, or a close short of the framing, is a lost pod.
A pod silent for ``upstream_read_timeout_s`` is treated as lost (504 before the head).
"""

from __future__ import annotations

import asyncio
import re
import time

from dataplane.router.http import ClientConnection
from dataplane.router.upstream import UpstreamConnection

# Hop-by-hop headers (RFC 9110 7.6.1) and the framing we redo ourselves.
HOP_BY_HOP = frozenset(
    b"connection keep-alive proxy-connection transfer-encoding te trailer upgrade content-length".split()
)
# Not forwarded to the pod: also the tenant's secret (pods sit on a private network and
# authenticate the router, not tenants) and what only concerns the client-router hop.
REQUEST_DROP = HOP_BY_HOP | {b"host", b"authorization", b"proxy-authorization", b"expect"}
# Not forwarded to the client: the pod's date/server say nothing useful about the router.
RESPONSE_DROP = HOP_BY_HOP | {b"date", b"server"}

USAGE_TAIL_BYTES = 2048  # usage sits at the end of a response (vLLM, OpenAI), bytes
_PROMPT_RE = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_COMPLETION_RE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


class UpstreamFailed(Exception):
    def __init__(self, before_response: bool, reason: str) -> None:
        super().__init__(reason)
        self.before_response = before_response  # nothing was sent to the client: retry is safe


def build_request(method: bytes, path: bytes, host: bytes, headers: dict[bytes, bytes], body: bytes) -> bytes:
    out = [b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-length: %d\r\n" % (method, path, host, len(body))]
    for k, v in headers.items():
        if k not in REQUEST_DROP:
            out.append(b"%s: %s\r\n" % (k, v))
    out.append(b"\r\n")
    out.append(body)
    return b"".join(out)


def parse_usage(tail: bytes) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) from the end of a response, when reported."""
    i = tail.rfind(b'"usage"')
    if i < 0:
        return None
    p = _PROMPT_RE.search(tail, i)
    c = _COMPLETION_RE.search(tail, i)
    if p is None or c is None:
        return None
    return int(p.group(1)), int(c.group(1))


class Exchange:
    __slots__ = (
        "body_started",
        "client",
        "conn",
        "done",
        "events",
        "head",
        "pod_header",
        "read_timeout_s",
        "status",
        "tail",
        "timer",
    )

    def __init__(
        self, client: ClientConnection, conn: UpstreamConnection, pod_header: bytes, read_timeout_s: float
    ) -> None:
        loop = client.loop
        self.client = client
        self.conn = conn
        self.pod_header = pod_header  # pre-encoded "x-pod: name\r\n"
        self.head: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.tail = b""
        self.events = 0  # SSE "data:" lines seen: tokens out when the pod reports no usage
        self.body_started = False
        self.read_timeout_s = read_timeout_s
        self.timer: asyncio.TimerHandle | None = loop.call_later(read_timeout_s, self._check_timeout)

    def _check_timeout(self) -> None:
        idle = time.monotonic() - self.conn.last_activity
        if idle >= self.read_timeout_s:
            self.timer = None
            self.conn.sink = None
            self.conn.close()
            self.upstream_lost(TimeoutError(f"pod silent for {idle:.1f} s"))
        else:  # activity since: re-arm for the rest of the window (one timer, not one per chunk)
            self.timer = self.client.loop.call_later(self.read_timeout_s - idle, self._check_timeout)

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    # --- Sink
    def upstream_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        length: int | None = None
        out = [self.pod_header]
        for k, v in headers:
            lk = k.lower()
            if lk == b"content-length":
                length = int(v) if v.isdigit() else None
            elif lk not in RESPONSE_DROP:
                out.append(b"%s: %s\r\n" % (k, v))
        client = self.client
        client.start_response(status, b"".join(out), length)
        client.flow_peer = self.conn
        if client.write_paused:
            self.conn.pause_reading()
        self.body_started = True
        if not self.head.done():
            self.head.set_result(None)

    def upstream_body(self, data: bytes) -> None:
        self.client.write_body(data)
        self.events += data.count(b"data:")
        tail = self.tail + data if len(data) < USAGE_TAIL_BYTES else data
        self.tail = tail[-USAGE_TAIL_BYTES:]

    def upstream_flush(self) -> None:
        self.client.flush_head()

    def upstream_done(self) -> None:
        self.cancel_timer()
        self.client.end_response()
        if not self.done.done():
            self.done.set_result(None)

    def upstream_lost(self, exc: BaseException | None) -> None:
        self.cancel_timer()
        reason = f"pod connection lost: {exc!r}"
        if not self.head.done():
            self.head.set_exception(UpstreamFailed(True, reason))
            self.done.set_exception(UpstreamFailed(True, reason))
            self.done.exception()  # mark retrieved: nobody awaits done when head failed
        elif not self.done.done():
            self.done.set_exception(UpstreamFailed(False, reason))
