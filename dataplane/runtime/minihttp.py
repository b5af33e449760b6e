"""A small HTTP/1.1 server and client on asyncio streams, for the runtime pods.

Stdlib only so that a simulated engine process stays small (a fleet of 200 runs on 2 cores).
It handles what the pods need: Content-Length bodies, keep-alive, and responses that stream
(SSE) and then close the connection. It is not a general web server: no chunked request
bodies, no pipelining beyond one request at a time per connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

REASONS = {
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class HttpLimits:
    max_header_bytes: int = 16 * 1024  # request line + headers, bytes
    max_body_bytes: int = 8 * 1024 * 1024  # request body, bytes (8 MiB: long prompts fit)
    keep_alive_s: float = 30.0  # idle time before a kept-alive connection is closed, seconds
    read_timeout_s: float = 30.0  # time to receive one request once started, seconds


@dataclass(frozen=True)
class Request:
    method: str  # upper case, e.g. "POST"
    path: str  # without the query string
    query: str  # the part after "?", or ""
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class StreamingResponse:
    """A response whose body is an async iterator of chunks; the connection closes after it.

    If the client goes away, the server closes the iterator (``aclose``), so a generator's
    ``finally`` can release what the request held.
    """

    status: int
    content_type: str
    body: AsyncIterator[bytes]
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response | StreamingResponse]]


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(payload).encode(), "application/json", headers or {})


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


async def _read_request(reader: asyncio.StreamReader, limits: HttpLimits) -> Request | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None  # client closed between requests
    except asyncio.LimitOverrunError as exc:
        raise _BadRequest(431, "headers too large") from exc
    if len(raw) > limits.max_header_bytes:
        raise _BadRequest(431, "headers too large")
    lines = raw.decode("latin-1").split("\r\n")
    try:
        method, target, _version = lines[0].split(" ", 2)
    except ValueError as exc:
        raise _BadRequest(400, "malformed request line") from exc
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequest(400, "malformed header")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", ""):
        raise _BadRequest(411, "chunked request bodies are not supported")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError as exc:
        raise _BadRequest(400, "bad content-length") from exc
    if length < 0 or length > limits.max_body_bytes:
        raise _BadRequest(413, "body too large")
    body = await reader.readexactly(length) if length else b""
    path, _, query = target.partition("?")
    return Request(method.upper(), path, query, headers, body)


class HttpServer:
    """Serves ``handler`` on one listening socket; one task per connection, tracked."""

    def __init__(
        self, handler: Handler, limits: HttpLimits | None = None, extra_headers: dict[str, str] | None = None
    ):
        self.handler = handler
        self.limits = limits or HttpLimits()
        self.extra_headers = extra_headers or {}
        self.server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        self.server = await asyncio.start_server(
            self._on_connection, host, port, limit=self.limits.max_header_bytes * 2
        )
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=2.0)

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve_connection(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        timeout = self.limits.keep_alive_s
        while True:
            try:
                request = await asyncio.wait_for(_read_request(reader, self.limits), timeout)
            except _BadRequest as exc:
                body = json.dumps({"error": str(exc)}).encode()
                await self._write(writer, Response(exc.status, body), keep_alive=False)
                return
            if request is None:
                return
            keep_alive = request.headers.get("connection", "").lower() != "close"
            # One error boundary per request: a handler bug is a 500, not a dropped socket.
            try:
                response = await self.handler(request)
            except Exception as exc:
                response = json_response(500, {"error": f"internal error: {exc!r}"})
            if isinstance(response, StreamingResponse):
                await self._stream(writer, response)
                return  # streamed responses close the connection
            await self._write(writer, response, keep_alive)
            if not keep_alive:
                return

    async def _stream(self, writer: asyncio.StreamWriter, response: StreamingResponse) -> None:
        headers = {
            **self.extra_headers,
            **response.headers,
            "content-type": response.content_type,
            "cache-control": "no-cache",
            "connection": "close",
        }
        try:
            writer.write(_head(response.status, headers))
            await writer.drain()
            async for chunk in response.body:
                writer.write(chunk)
                await writer.drain()
        finally:
            if isinstance(response.body, AsyncGenerator):
                await response.body.aclose()

    async def _write(self, writer: asyncio.StreamWriter, response: Response, keep_alive: bool) -> None:
        headers = {
            **self.extra_headers,
            **response.headers,
            "content-type": response.content_type,
            "content-length": str(len(response.body)),
            "connection": "keep-alive" if keep_alive else "close",
        }
        writer.write(_head(response.status, headers) + response.body)
        await writer.drain()


@dataclass(frozen=True)
class ClientResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def request(
    method: str,
    host: str,
    port: int,
    path: str,
    *,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    timeout_s: float = 10.0,
) -> ClientResponse:
    """One request on a fresh connection (``Connection: close``), read to the end.

    Raises OSError (refused, reset) and TimeoutError; a caller that probes treats both as a
    failed probe. The whole exchange is bounded by ``timeout_s``.
    """
    return await asyncio.wait_for(_request(method, host, port, path, body, headers or {}), timeout_s)


async def _request(
    method: str, host: str, port: int, path: str, body: bytes, headers: dict[str, str]
) -> ClientResponse:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        head = {"host": f"{host}:{port}", "connection": "close", "content-length": str(len(body)), **headers}
        lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    head_raw, sep, payload = raw.partition(b"\r\n\r\n")
    if not sep:
        raise ConnectionError("incomplete HTTP response")
    status_line, *header_lines = head_raw.decode("latin-1").split("\r\n")
    status = int(status_line.split(" ", 2)[1])
    resp_headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        resp_headers[name.strip().lower()] = value.strip()
    if "chunked" in resp_headers.get("transfer-encoding", ""):
        payload = _dechunk(payload)
    return ClientResponse(status, resp_headers, payload)


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return bytes(out)
