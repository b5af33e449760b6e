"""The runtime pods' HTTP server: uvicorn's httptools protocol serving a small raw ASGI app.

The simulated engine, the pod's probe server and the cluster agent write handlers that take a
``Request`` and return a ``Response`` or a ``StreamingResponse``; this module serves them with
uvicorn, as vLLM's API server is served (vllm/entrypoints/launchers/launcher.py: uvicorn, with
httptools when it is installed). uvicorn parses the requests and frames the answers: a
``Response`` goes out with Content-Length, a ``StreamingResponse`` with Transfer-Encoding:
chunked, and both leave the connection open for the next request (closed after ``keep_alive_s``
idle: 5 s, vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE in vllm/envs.py).

A client that disconnects before its answer is complete cancels the handler (a non-streamed
request) or the stream, as vLLM's ``with_cancellation`` and Starlette's StreamingResponse do
(vllm/entrypoints/serve/utils/api_utils.py); the simulated engine then aborts the request and
its slot is free at once.

uvicorn's ``Server`` is not used: its main loop wakes every 0.1 s (to refresh the Date header
and check for exit), which a fleet of 200 idle simulated engines on 2 cores would pay for. The
listener here wakes only for traffic, and the Date header is stamped per response instead.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from functools import lru_cache
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from dataplane.wire import json_depth


@dataclass(frozen=True)
class HttpLimits:
    max_header_bytes: int = 16 * 1024  # request line + headers, bytes; a longer head gets 431
    max_body_bytes: int = 8 * 1024 * 1024  # request body, bytes (8 MiB: long prompts fit); more gets 413
    keep_alive_s: float = 5.0  # idle kept-alive connection closed after, s (vLLM's default)
    drain_s: float = 2.0  # on close, requests in flight get this long before they are cancelled, s


@dataclass(frozen=True)
class Request:
    method: str  # upper case, e.g. "POST"; a HEAD request reaches the handler as "GET"
    path: str  # without the query string, percent-decoded
    query: str  # the part after "?", or ""
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        """The body's JSON; a ValueError when it is none, or nests too deep (json_depth)."""
        return json_depth.loads(self.body)


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class StreamingResponse:
    """A response whose body is an async generator of chunks, sent chunked as they come.

    When the stream ends early (the client went away, or the server closes), the generator is
    closed (``aclose``), so its ``finally`` can release what the request held.
    """

    status: int
    content_type: str
    body: AsyncGenerator[bytes, None]
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response | StreamingResponse]]


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(payload).encode(), "application/json", headers or {})


@lru_cache(maxsize=1)
def _http_date(second: int) -> bytes:
    """The Date header's value (RFC 9110 section 6.6.1), computed once per second."""
    return formatdate(second, usegmt=True).encode()


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a request head over the limit."""


class _BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bound on the request head (uvicorn bounds it only in
    its h11 protocol); a longer head is answered 431 and the connection closed.

    Two counts: the callbacks add up the target and the headers as they are parsed (a complete
    head over the limit), and the bytes that arrive while the head is still incomplete are added
    as they come (a head that never ends, or one endless header line, which httptools would
    buffer without bound; a pipelined request may count a little of the one before it).
    """

    def __init__(self, config: uvicorn.Config, server_state: ServerState, max_head_bytes: int) -> None:
        super().__init__(config, server_state, app_state={})
        self.max_head_bytes = max_head_bytes
        self.in_head = False  # from a request's first byte until its headers are complete
        self.parsed_head_bytes = 0  # target and headers of the current request, bytes
        self.unparsed_head_bytes = 0  # bytes received while the current head stays incomplete

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.in_head and not self.transport.is_closing():
            self.unparsed_head_bytes += len(data)
            if self.unparsed_head_bytes > self.max_head_bytes:
                self._refuse_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.in_head, self.parsed_head_bytes, self.unparsed_head_bytes = True, 0, 0

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.in_head = False
        super().on_headers_complete()

    def _count(self, size: int) -> None:
        self.parsed_head_bytes += size
        if self.parsed_head_bytes > self.max_head_bytes:
            raise _HeadTooLarge  # httptools stops; uvicorn answers it through send_400_response

    def send_400_response(self, msg: str) -> None:
        if self.parsed_head_bytes > self.max_head_bytes:
            self._refuse_head()
        else:
            super().send_400_response(msg)

    def _refuse_head(self) -> None:
        # Written as uvicorn writes its own 400 (no request was read, so no ASGI cycle exists).
        body = json.dumps({"error": f"request line and headers exceed {self.max_head_bytes} bytes"}).encode()
        head = [STATUS_LINE[431]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)]
        head += [b"connection: close\r\n\r\n"]
        self.transport.write(b"".join(head) + body)
        self.transport.close()


class _Disconnected(Exception):
    """The client went away before the request body was read."""


class _App:
    """The raw ASGI app: reads the request, runs the handler, sends what it returns."""

    def __init__(self, handler: Handler, limits: HttpLimits) -> None:
        self.handler = handler
        self.limits = limits

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            request = await self._read(scope, receive)
        except _Disconnected:
            return
        if isinstance(request, Response):
            await _send_response(send, request)
            return
        # One task answers, one waits for a disconnect; the first to finish ends the other.
        answer = asyncio.create_task(self._answer(request, send))
        disconnect = asyncio.create_task(_disconnected(receive))
        try:
            await asyncio.wait((answer, disconnect), return_when=asyncio.FIRST_COMPLETED)
        finally:
            disconnect.cancel()
            if not answer.done():
                answer.cancel()  # the handler or the stream learns it at its next await
            await asyncio.wait((answer, disconnect))
        if not answer.cancelled():
            answer.result()  # a failure while sending: uvicorn logs it and closes the connection

    async def _read(self, scope: Any, receive: Any) -> Request | Response:
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        limit = self.limits.max_body_bytes
        too_large = json_response(
            413, {"error": f"request body exceeds {limit} bytes"}, {"connection": "close"}
        )
        if int(headers.get("content-length", "0")) > limit:  # httptools has checked it is a number
            return too_large
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            body += message.get("body", b"")
            if len(body) > limit:  # a chunked body, whose size is known only as it comes
                return too_large
            if not message.get("more_body", False):
                break
        method = scope["method"]
        return Request(
            "GET" if method == "HEAD" else method,  # uvicorn sends no body for HEAD
            scope["path"],
            scope["query_string"].decode("latin-1"),
            headers,
            bytes(body),
        )

    async def _answer(self, request: Request, send: Any) -> None:
        # One error boundary per request: a handler bug is a 500, not a dropped connection.
        try:
            response = await self.handler(request)
        except Exception as exc:
            response = json_response(500, {"error": f"internal error: {exc!r}"})
        if isinstance(response, StreamingResponse):
            await _send_stream(send, response)
        else:
            await _send_response(send, response)


async def _disconnected(receive: Any) -> None:
    """Returns when the client has gone (or the answer is complete: uvicorn says both alike)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _head(status: int, content_type: str, headers: dict[str, str]) -> dict[str, Any]:
    fields = [(b"date", _http_date(int(time.time()))), (b"content-type", content_type.encode("latin-1"))]
    fields += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    return {"type": "http.response.start", "status": status, "headers": fields}


async def _send_response(send: Any, response: Response) -> None:
    headers = {**response.headers, "content-length": str(len(response.body))}
    await send(_head(response.status, response.content_type, headers))
    await send({"type": "http.response.body", "body": response.body})


async def _send_stream(send: Any, response: StreamingResponse) -> None:
    # No Content-Length: uvicorn sends the body chunked, one chunk per piece.
    try:
        await send(_head(response.status, response.content_type, response.headers))
        async for chunk in response.body:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        await response.body.aclose()


class HttpServer:
    """Serves ``handler`` on one listening socket with uvicorn's HTTP/1.1 protocol."""

    def __init__(
        self, handler: Handler, limits: HttpLimits | None = None, extra_headers: dict[str, str] | None = None
    ):
        self.limits = limits or HttpLimits()
        self.config = uvicorn.Config(
            _App(handler, self.limits),
            http="httptools",
            ws="none",
            lifespan="off",
            interface="asgi3",
            log_config=None,  # the process's own logging, as configured by its main
            access_log=False,
            proxy_headers=False,
            date_header=False,  # stamped per response (see the module's docstring)
            headers=list((extra_headers or {}).items()),  # on every answer, uvicorn's own included
            timeout_keep_alive=self.limits.keep_alive_s,  # type: ignore[arg-type]  # uvicorn takes any delay
        )
        self.config.load()
        self.state = ServerState()
        self.state.default_headers = self.config.encoded_headers
        self.listener: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listens on host:port (0: any free port); returns the port. OSError if it is taken."""
        self.listener = await asyncio.get_running_loop().create_server(
            lambda: _BoundedHttpToolsProtocol(self.config, self.state, self.limits.max_header_bytes),
            host,
            port,
        )
        return int(self.listener.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stops accepting, lets requests in flight finish for ``drain_s``, then cancels them."""
        if self.listener is None:
            return
        self.listener.close()
        for connection in list(self.state.connections):
            connection.shutdown()  # idle ones close now, busy ones after their answer
        if self.state.tasks:
            _, late = await asyncio.wait(set(self.state.tasks), timeout=self.limits.drain_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        await self.listener.wait_closed()
