"""The production web server's worker: uvicorn under gunicorn, serving Django's ASGI app, with
deadlines for slow clients.

An asyncio worker holds a slow client as a coroutine, not a thread, so slow or many clients do
not starve the others (gunicorn's sync and gthread workers block a thread per client reading
headers). Uvicorn itself waits for headers and bodies without end; ``DeadlineProtocol`` adds the
two deadlines: a request's headers must be complete within ``header_timeout_s`` of its
connection (or, on a kept-alive connection, of its first byte), its body within
``body_timeout_s`` of its headers. A client that misses one gets 408 and is disconnected. The
numbers are set in ``controlplane/gunicorn.conf.py`` (``configure``), the server's one
configuration file.

``BoundedApp`` wraps Django's ASGI app: at most ``app_concurrency`` requests per worker run
inside Django at once (so threads and database connections stay bounded however many clients
come), and a request enters only once its body is in (up to ``prefetch_body_bytes``), so
clients that send their bodies slowly wait as coroutines and hold no thread.
"""

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn_worker import UvicornWorker


@dataclass
class Deadlines:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    # Connections plus requests in flight per worker beyond which a request gets 503 at once.
    limit_concurrency: int = 1000
    # Requests inside Django at once per worker: each sync view takes a thread and a database
    # connection while it runs; the others wait in the event loop (``BoundedApp``).
    app_concurrency: int = 16
    # A body up to this size is read in full before its request enters Django (a slow body
    # then holds no thread); a larger one streams in as Django reads it (Django's own limits).
    prefetch_body_bytes: int = 2_621_440


DEADLINES = Deadlines()


def configure(**values: Any) -> None:
    """Set the deadlines (from gunicorn.conf.py, in the master, before workers fork)."""
    for name, value in values.items():
        if not hasattr(DEADLINES, name):
            raise TypeError(f"unknown web server setting {name!r}")
        setattr(DEADLINES, name, value)


REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 16\r\nconnection: close\r\n\r\nrequest timeout\n"
)


class DeadlineProtocol(HttpToolsProtocol):
    """Uvicorn's httptools protocol with a header deadline and a body deadline."""

    deadline: asyncio.TimerHandle | None = None

    def _arm(self, seconds: float, waiting_for: str) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(seconds, self._expired, waiting_for)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expired(self, waiting_for: str) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        self.logger.info("%s: %s not complete in time, closing", self.client, waiting_for)
        if waiting_for == "headers":  # nothing was answered yet on this request
            self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()  # a request being read sees the disconnect

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(DEADLINES.header_timeout_s, "headers")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.deadline is None:  # a kept-alive connection's next request starts its clock
            self._arm(DEADLINES.header_timeout_s, "headers")

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(DEADLINES.body_timeout_s, "body")

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


class Worker(UvicornWorker):  # type: ignore[misc]
    """gunicorn's worker class: uvicorn on uvloop with ``DeadlineProtocol``."""

    CONFIG_KWARGS: dict[str, Any] = {"loop": "uvloop", "http": DeadlineProtocol, "ws": "none"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.CONFIG_KWARGS = {**self.CONFIG_KWARGS, "limit_concurrency": DEADLINES.limit_concurrency}
        super().__init__(*args, **kwargs)


Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class BoundedApp:
    """An ASGI app that lets at most ``app_concurrency`` requests into ``app`` at once, each
    with its body already read (up to ``prefetch_body_bytes``)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._slots: asyncio.Semaphore | None = None  # made in the worker's event loop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        early: list[Message] = []
        size = 0
        while size <= DEADLINES.prefetch_body_bytes:
            message = await receive()
            early.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
            size += len(message.get("body", b""))
        if early[-1]["type"] == "http.disconnect":
            return  # gone before its request was in: nothing to answer

        async def replay() -> Message:
            return early.pop(0) if early else await receive()

        if self._slots is None:
            self._slots = asyncio.Semaphore(DEADLINES.app_concurrency)
        async with self._slots:
            await self.app(scope, replay, send)
