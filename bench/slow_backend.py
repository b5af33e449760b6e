"""A slow streaming backend for the concurrency benchmark (a stand-in pod, not a model).

    python bench/slow_backend.py --port 18401 [--events 10] [--interval 1.0]

Answers every POST with an SSE stream: ``--events`` events ``--interval`` seconds apart, then a
usage event and [DONE]; GET /health answers 200. One asyncio Protocol per connection on uvloop,
one timer per stream (no task per stream), so a single process holds thousands of streams.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
from typing import cast

import httptools
import uvloop

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
EVENT = b'data: {"choices": [{"index": 0, "text": "tok"}]}\n\n'
CHUNK = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
END_EV = (
    b'data: {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 10, '
    b'"total_tokens": 20}}\n\ndata: [DONE]\n\n'
)
END = b"%x\r\n%s\r\n0\r\n\r\n" % (len(END_EV), END_EV)


class Stream(asyncio.Protocol):
    events = 10
    interval = 1.0

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.left = 0
        self.timer: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()
        self.url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_message_complete(self) -> None:
        assert self.transport is not None
        if self.url.startswith(b"/health"):
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            return
        self.transport.write(HEAD)
        self.left = self.events
        self.timer = self.loop.call_later(self.interval, self.tick)

    def tick(self) -> None:
        if self.transport is None:
            return
        self.left -= 1
        if self.left > 0:
            self.transport.write(CHUNK)
            self.timer = self.loop.call_later(self.interval, self.tick)
        else:
            self.transport.write(CHUNK + END)
            self.timer = None


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--events", type=int, default=10)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    Stream.events, Stream.interval = args.events, args.interval
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = await asyncio.get_running_loop().create_server(Stream, "127.0.0.1", args.port, backlog=8192)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main())
