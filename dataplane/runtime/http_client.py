"""A small HTTP/1.1 client for the runtime's own calls to engines: the prober's scrapes and
probes, the benchmark drivers and the fleet benchmark.

Answers are parsed by httptools (llhttp, the parser uvicorn and the router use), so bodies end
as RFC 9112 section 6.3 says: at Content-Length, at the last chunk, or, with neither, at the
close. It is lean on purpose: the benchmark sweep runs the client beside the engine on a 2-core
machine, where httpx's ~1 ms of CPU per request (against ~0.1 ms here) would be measured as the
engine's. Not for HEAD requests (their answers announce a body they do not carry).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httptools

READ_SIZE = 64 * 1024  # bytes read from the socket at a time


@dataclass(frozen=True)
class ClientResponse:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class _Answer:
    """What httptools' callbacks collect of one answer."""

    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    headers_complete: bool = False
    complete: bool = False
    keep_alive: bool = False  # the answer lets the connection serve another request
    parser: httptools.HttpResponseParser | None = None  # read in the callbacks: it resets after them

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_complete = True

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser is not None and self.parser.should_keep_alive()

    def close_delimited(self) -> bool:
        """Neither Content-Length nor chunked: the body runs to the close."""
        chunked = "chunked" in self.headers.get("transfer-encoding", "")
        return "content-length" not in self.headers and not chunked


class Connection:
    """One HTTP/1.1 connection to an engine, one request at a time, kept alive between them."""

    def __init__(self, host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.host = host  # the Host header's value
        self.reader = reader
        self.writer = writer
        self.reusable = True  # False once the server asked to close, or the body ran to the close

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(f"{host}:{port}", reader, writer)

    async def exchange(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> ClientResponse:
        """Sends one request and reads its whole answer. Raises ConnectionError when the server
        closes or resets before the answer is complete, or answers what is not HTTP."""
        head = {"host": self.host, **(headers or {}), "content-length": str(len(body))}
        lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items())]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await self.writer.drain()
        answer = _Answer()
        parser = answer.parser = httptools.HttpResponseParser(answer)
        while not answer.complete:
            data = await self.reader.read(READ_SIZE)
            if not data:
                if answer.headers_complete and answer.close_delimited():
                    self.reusable = False
                    break
                raise ConnectionError("the server closed the connection before its answer was complete")
            try:
                parser.feed_data(data)
            except httptools.HttpParserError as exc:
                raise ConnectionError(f"the server's answer is not valid HTTP: {exc}") from None
        self.reusable = self.reusable and answer.keep_alive
        return ClientResponse(parser.get_status_code(), answer.headers, bytes(answer.body))

    def close(self) -> None:
        self.writer.close()


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

    Raises OSError (refused, reset, closed early) and TimeoutError; a caller that probes treats
    both as a failed probe. The whole exchange is bounded by ``timeout_s``.
    """
    return await asyncio.wait_for(_request(method, host, port, path, body, headers or {}), timeout_s)


async def _request(
    method: str, host: str, port: int, path: str, body: bytes, headers: dict[str, str]
) -> ClientResponse:
    connection = await Connection.open(host, port)
    try:
        return await connection.exchange(method, path, body, {"connection": "close", **headers})
    finally:
        connection.close()
