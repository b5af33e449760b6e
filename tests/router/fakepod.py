"""A stand-in pod for router tests: an OpenAI-ish HTTP/1.1 server on 127.0.0.1 (not a model).

Behaviour per request, chosen by the pod's ``mode`` or the request's ``x-fake`` header:
  ok        JSON completion with usage (prompt 10, completion ``completion_tokens``: 20 tokens)
  stream    SSE: ``chunks`` events ``delay_s`` apart, then a usage event and [DONE]
  close     read the request, close the connection without answering (retry before first byte)
  break     start a stream, send one event, then close, or reset when the framing is "close"
            (no retry after the first byte)
  hold      answer nothing until released (queueing, drain)
  error     500 JSON
  refuse    400 JSON, as vLLM refuses a request after reading its prompt
  nousage   the ok answer without its usage
A 200 answer is framed by ``framing``: "chunked" (streams; JSON has a Content-Length) or "close"
(no Content-Length, no chunks: the body ends when the pod closes the connection, RFC 9112 6.3).
Counts requests and open connections so tests can assert what reached which pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct


def reset(writer: asyncio.StreamWriter) -> None:
    """Drop the connection with a TCP reset (SO_LINGER 0), not the FIN of a clean close."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FakePod:
    def __init__(self, name: str, mode: str = "ok", chunks: int = 3, delay_s: float = 0.01) -> None:
        self.name = name
        self.mode = mode
        self.chunks = chunks
        self.delay_s = delay_s
        self.pad = 0  # extra bytes of text per streamed event
        self.framing = "chunked"  # or "close": 200 bodies delimited by closing the connection
        self.completion_tokens = 20  # the usage of an "ok" answer (prompt 10 tokens)
        self.requests = 0
        self.health_checks = 0
        self.health_ok = True
        self.open_connections = 0
        self.cancelled = 0  # streams whose client went away mid-stream
        self.release = asyncio.Event()
        self.bodies: list[dict[str, object]] = []
        self.headers: list[dict[str, str]] = []
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakePod:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self.release.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_connections += 1
        try:
            for _ in range(10_000):  # keep-alive: bounded number of requests per connection
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                _method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if path == "/health":
                    self.health_checks += 1
                    status = b"200 OK" if self.health_ok else b"503 Service Unavailable"
                    writer.write(b"HTTP/1.1 %s\r\ncontent-length: 2\r\n\r\nok" % status)
                    await writer.drain()
                    continue
                self.requests += 1
                self.headers.append(headers)
                with contextlib.suppress(ValueError):
                    self.bodies.append(json.loads(body or b"{}"))
                mode = headers.get("x-fake", self.mode)
                if mode == "close":
                    return
                if mode == "hold":
                    await self.release.wait()
                    mode = "ok"
                if mode in ("error", "refuse"):
                    payload = b'{"error": {"message": "boom"}}'
                    status = b"500 Internal Server Error" if mode == "error" else b"400 Bad Request"
                    writer.write(
                        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (status, len(payload), payload)
                    )
                elif mode in ("stream", "break"):
                    framed = self.framing == "chunked"
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n%s\r\n"
                        % (b"transfer-encoding: chunked\r\n" if framed else b"")
                    )
                    n = 1 if mode == "break" else self.chunks
                    try:
                        for i in range(n):
                            ev = b'data: {"choices": [{"text": "t%d%s"}]}\n\n' % (i, b"y" * self.pad)
                            writer.write(b"%x\r\n%s\r\n" % (len(ev), ev) if framed else ev)
                            await writer.drain()
                            await asyncio.sleep(self.delay_s)
                        if mode == "break":
                            if not framed:  # a clean close would end the body: only a reset cuts it
                                reset(writer)
                            return
                        ev = (
                            b'data: {"choices": [], "usage": {"prompt_tokens": 10, '
                            b'"completion_tokens": %d, "total_tokens": %d}}\n\ndata: [DONE]\n\n' % (n, 10 + n)
                        )
                        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(ev), ev) if framed else ev)
                    except (ConnectionError, OSError):
                        self.cancelled += 1
                        return
                    if not framed:
                        await writer.drain()
                        return  # the close ends the body
                else:
                    payload = json.dumps(
                        {
                            "id": "cmpl-1",
                            "object": "text_completion",
                            "pod": self.name,
                            "choices": [{"index": 0, "text": "hello"}],
                            "usage": None
                            if mode == "nousage"
                            else {
                                "prompt_tokens": 10,
                                "completion_tokens": self.completion_tokens,
                                "total_tokens": 10 + self.completion_tokens,
                            },
                        }
                    ).encode()
                    length = b"content-length: %d\r\n" % len(payload) if self.framing == "chunked" else b""
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n%s\r\n%s" % (length, payload)
                    )
                    if not length:
                        await writer.drain()
                        return  # the close ends the body
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError, asyncio.LimitOverrunError):
            pass
        finally:
            self.open_connections -= 1
            writer.close()
