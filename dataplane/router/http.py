"""HTTP/1.1 server side: one asyncio Protocol per client connection, parsing with httptools.

Parsing and framing only; what to do with a request is the handler's business (server.py). The
connection enforces the client-side limits of ``RouterConfig``: header and body read timeouts
(slowloris -> 408), header and body sizes (431, 413), idle keep-alive, and a bounded pipeline.
Requests on one connection are handled one at a time, in order (HTTP/1.1 pipelining semantics),
each in its own task, which is cancelled if the client goes away.

Backpressure: the transport's write buffer limits are the config's high/low water marks; when the
client reads slower than the pod writes, ``pause_writing`` pauses reading from the linked
upstream connection (``flow_peer``) and ``resume_writing`` resumes it, so no buffer grows past
about high water + one socket read.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

import httptools

from dataplane.router.config import RouterConfig

log = logging.getLogger("dataplane.router")

REASONS = {
    200: b"OK",
    400: b"Bad Request",
    401: b"Unauthorized",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    413: b"Payload Too Large",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "timeout_error",
}


def status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, b"Unknown"))


def error_body(
    status: int, message: str, code: str | int, param: str | None = None, kind: str | None = None
) -> bytes:
    """OpenAI-style error: {"error": {"message", "type", "param", "code"}}; ``param`` names the
    request parameter at fault, when one is; ``kind`` is its type when not the status's (an
    error in the engine's words: vLLM's "BadRequestError", its code the status)."""
    return json.dumps(
        {
            "error": {
                "message": message,
                "type": kind or ERROR_TYPES.get(status, "server_error"),
                "param": param,
                "code": code,
            }
        }
    ).encode()


def loopback_peer(peer: object) -> bool:
    """Whether a socket's peer address is loopback (127.0.0.0/8 or ::1, IPv4-mapped too); not
    an IP address (a Unix socket) never is."""
    if not isinstance(peer, tuple):
        return False
    try:
        ip = ipaddress.ip_address(peer[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


class RequestError(Exception):
    """A request the router answers itself, before any response byte, with an OpenAI-style error
    (``send_error``); ``headers`` are extra pre-encoded header lines, such as a Retry-After;
    ``param`` names the request parameter at fault (the error's "param"); ``kind``, the error's
    type where it is not the status's (``error_body``)."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | int,
        headers: bytes = b"",
        param: str | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers
        self.param, self.kind = param, kind


class Request:
    __slots__ = ("body", "headers", "http11", "keep_alive", "method", "path")

    def __init__(
        self,
        method: bytes,
        path: bytes,
        headers: dict[bytes, bytes],
        body: bytes,
        keep_alive: bool,
        http11: bool,
    ) -> None:
        self.method = method  # b"POST"
        self.path = path  # b"/v1/completions" (query string included)
        self.headers = headers  # lower-case name -> value; a repeated header keeps the last value
        self.body = body
        self.keep_alive = keep_alive
        self.http11 = http11


class FlowPeer(Protocol):
    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


Handler = Callable[["ClientConnection", Request], Awaitable[None]]


class _Abort(Exception):
    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class ServerState:
    """What all connections of one listening server share: config, handler, bookkeeping."""

    def __init__(self, config: RouterConfig, handler: Handler) -> None:
        self.config = config
        self.handler = handler
        self.connections: set[ClientConnection] = set()
        self.active_requests = 0  # requests being handled, count (0 when idle: tests assert it)
        self.draining = False
        self.idle_event = asyncio.Event()  # set whenever active_requests drops to 0


class ClientConnection(asyncio.Protocol):
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.config = state.config
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.write_paused = False
        self.flow_peer: FlowPeer | None = None  # the upstream to pause while our buffer is full
        self.response_started = False
        self.response_ended = False  # the whole response is written: the client has all of it
        self.response_chunked = False
        self._head_only = False  # answering a HEAD request: the head of the GET answer, no body
        self._head = b""  # response head not yet written: it goes out with the first body bytes
        self._pending: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_len = 0
        self._in_message = False
        self._keep_alive = True
        self._http11 = True

    # --- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.set_write_buffer_limits(
            self.config.write_high_water_bytes, self.config.write_low_water_bytes
        )
        self.state.connections.add(self)
        self._arm(self.config.header_read_timeout_s, self._on_idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.state.connections.discard(self)
        self._disarm()
        if self._task is not None and not self._task.done() and not self.response_ended:
            # The client is gone mid-answer: cancel the upstream request. Once the whole answer
            # is written the request is served, whatever the client does next: its handler
            # finishes its bookkeeping (closing as soon as it has read it is no error).
            self._task.cancel()
        self._pending.clear()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _Abort):
                self._fail(cause.status, cause.message, cause.code)
            else:
                self._fail(400, "malformed HTTP request", "bad_request")
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported", "bad_request")
        except httptools.HttpParserError:
            self._fail(400, "malformed HTTP request", "bad_request")

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.flow_peer is not None:
            self.flow_peer.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.flow_peer is not None:
            self.flow_peer.resume_reading()

    # --- timers
    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_idle_timeout(self) -> None:
        self._timer = None
        if self._in_message:
            self._fail(408, "timed out reading the request headers", "request_timeout")
        elif self._task is None and self.transport is not None:
            self.transport.close()  # idle keep-alive (or silent new connection): close quietly

    def _on_body_timeout(self) -> None:
        self._timer = None
        self._fail(408, "timed out reading the request body", "request_timeout")

    # --- httptools callbacks
    def on_message_begin(self) -> None:
        self._in_message = True
        self._url = b""
        self._headers = {}
        self._header_bytes = 0
        self._body = []
        self._body_len = 0
        if self._task is None:  # while a request runs, its own deadlines govern
            self._arm(self.config.header_read_timeout_s, self._on_idle_timeout)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._header_bytes += len(url)
        if self._header_bytes > self.config.max_header_bytes:
            raise _Abort(431, "request line and headers too large", "headers_too_large")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self.config.max_header_bytes:
            raise _Abort(431, "request line and headers too large", "headers_too_large")
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        length = self._headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.config.max_body_bytes:
            raise _Abort(
                413, f"request body larger than {self.config.max_body_bytes} bytes", "body_too_large"
            )
        if self._headers.get(b"expect", b"").lower() == b"100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits 1 s for it otherwise
        if self._task is None:
            self._arm(self.config.body_read_timeout_s, self._on_body_timeout)

    def on_body(self, body: bytes) -> None:
        self._body_len += len(body)
        if self._body_len > self.config.max_body_bytes:
            raise _Abort(
                413, f"request body larger than {self.config.max_body_bytes} bytes", "body_too_large"
            )
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        p = self.parser
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        req = Request(
            p.get_method(),
            self._url,
            self._headers,
            body,
            p.should_keep_alive(),
            p.get_http_version() == "1.1",
        )
        self._body = []
        if self._task is None:
            self._disarm()
            self._start(req)
        else:
            self._pending.append(req)
            if len(self._pending) >= self.config.max_pipelined_requests and self.transport is not None:
                self.transport.pause_reading()

    # --- request lifecycle
    def _start(self, req: Request) -> None:
        self.response_started = self.response_ended = False
        self._head_only = req.method == b"HEAD"
        self._keep_alive = req.keep_alive and not self.state.draining
        self._http11 = req.http11
        self.state.active_requests += 1
        self._task = self.loop.create_task(self._run(req))

    async def _run(self, req: Request) -> None:
        try:
            await self.state.handler(self, req)
        except asyncio.CancelledError:
            self._keep_alive = False
            if not self.closed and self.transport is not None:
                self.transport.abort() if self.response_started else self.transport.close()
        except Exception:  # one error boundary per request: 500 before headers, close after
            log.exception("request handler failed (%s)", "cut" if self.response_started else "answered 500")
            self._keep_alive = False
            if not self.response_started:
                self.send_error(500, "internal router error", "internal_error")
            elif self.transport is not None:
                self.transport.abort()
        finally:
            self._finished()

    def _finished(self) -> None:
        self._head = b""
        self._task = None
        self.flow_peer = None
        st = self.state
        st.active_requests -= 1
        if st.active_requests == 0:
            st.idle_event.set()
        if self.closed or self.transport is None:
            return
        if not self._keep_alive or self.state.draining:
            self.transport.close()
            return
        if self._pending:
            if len(self._pending) == self.config.max_pipelined_requests:
                self.transport.resume_reading()
            self._start(self._pending.popleft())
        elif self._in_message:
            self._arm(self.config.header_read_timeout_s, self._on_idle_timeout)
        else:
            self._arm(self.config.idle_keepalive_s, self._on_idle_timeout)

    def _fail(self, status: int, message: str, code: str) -> None:
        """A request we cannot parse or read in time: answer it if we may, then close."""
        self._in_message = False
        self._keep_alive = False
        if self.transport is None or self.closed:
            return
        self.transport.pause_reading()
        if self._task is None:
            self._disarm()
            self.send_error(status, message, code)
            self.transport.close()
        # else: a response is in progress on this connection; close after it (keep_alive False)

    # --- responses (used by the handler)
    def send_response(self, status: int, headers: bytes, body: bytes) -> None:
        """A complete response; ``headers`` are pre-encoded "Name: value\\r\\n" lines. To a HEAD
        request the same head, Content-Length included, without the body (RFC 9110 9.3.2)."""
        if self.transport is None or self.closed:
            return
        self.response_started = self.response_ended = True
        conn = b"" if self._keep_alive else b"connection: close\r\n"
        self.transport.write(
            b"%scontent-length: %d\r\n%s%s\r\n%s"
            % (status_line(status), len(body), headers, conn, b"" if self._head_only else body)
        )

    def send_error(
        self,
        status: int,
        message: str,
        code: str | int,
        extra_headers: bytes = b"",
        param: str | None = None,
        kind: str | None = None,
    ) -> None:
        self.send_response(
            status,
            b"content-type: application/json\r\n" + extra_headers,
            error_body(status, message, code, param, kind),
        )

    def send_json(self, status: int, obj: Any) -> None:
        self.send_response(status, b"content-type: application/json\r\n", json.dumps(obj).encode())

    def start_response(self, status: int, headers: bytes, content_length: int | None) -> None:
        """Headers of a response whose body follows in ``write_body`` calls."""
        if self.transport is None or self.closed:
            return
        self.response_started = True
        if content_length is not None:
            framing = b"content-length: %d\r\n" % content_length
            self.response_chunked = False
        elif self._http11:
            framing = b"transfer-encoding: chunked\r\n"
            self.response_chunked = True
        else:  # HTTP/1.0 knows no chunks: the body ends when the connection closes
            framing = b""
            self.response_chunked = False
            self._keep_alive = False
        conn = b"" if self._keep_alive else b"connection: close\r\n"
        # held back and sent with the first body bytes: one write (one syscall) per small response
        self._head = b"%s%s%s%s\r\n" % (status_line(status), headers, framing, conn)

    def flush_head(self) -> None:
        """Send a held-back head now (a stream whose first event has not come yet)."""
        if self._head and self.transport is not None and not self.closed:
            self.transport.write(self._head)
        self._head = b""

    def write_body(self, data: bytes) -> None:
        if self.transport is None or self.closed or not data:
            return
        if self.response_chunked:
            data = b"%x\r\n%s\r\n" % (len(data), data)
        if self._head:
            data = self._head + data
            self._head = b""
        self.transport.write(data)

    def end_response(self, last: bytes = b"") -> None:
        """End the body, ``last`` its final bytes: one write (one syscall) with the framing's end."""
        if self.transport is None or self.closed:
            return
        self.response_ended = True
        if self.response_chunked:
            if last:  # head (when still held), last chunk and end in one format: one copy of last
                self.transport.write(b"%s%x\r\n%s\r\n0\r\n\r\n" % (self._head, len(last), last))
                self._head = b""
                return
            tail = b"0\r\n\r\n"
        else:
            tail = last
        if self._head or tail:
            self.transport.write(self._head + tail)
        self._head = b""

    def peer_is_loopback(self) -> bool:
        """Whether the client connects from this host (asked only by operator endpoints)."""
        return loopback_peer(
            self.transport.get_extra_info("peername") if self.transport is not None else None
        )

    def abort(self) -> None:
        """Cut the connection mid-response: the client sees a truncated body, never a wrong one."""
        self._keep_alive = False
        if self.transport is not None:
            self.transport.abort()

    def close_when_idle(self) -> None:
        """Graceful shutdown: close now if idle, else after the current response."""
        self._keep_alive = False
        if self._task is None and not self._in_message and self.transport is not None:
            self.transport.close()
