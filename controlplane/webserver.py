"""The production web server's worker: uvicorn under gunicorn, serving Django's ASGI app, with
deadlines for slow clients.

An asyncio worker holds a slow client as a coroutine, not a thread. ``DeadlineProtocol`` adds what
uvicorn lacks: deadlines for a request's head and body (408), a bound on the head (431), deadlines
for a client that does not read its response, and reads paused while ``max_pipelined_requests``
wait (``PipelineFlowControl``). ``BoundedApp`` lets at most ``app_concurrency`` requests per worker
into Django, each with its body read, keeps slots of their own for /healthz and static files, and
answers a body over ``max_body_bytes`` with 413; ``OneHopHandler`` runs Django's middleware and
view in one hop to the request's thread; ``ConnectionShare`` evens kept-alive connections out
between gunicorn's workers. The numbers are set in
``controlplane/gunicorn.conf.py`` (``configure``), the server's one configuration file. Each
deadline and bound: docs/kubernetes.md, "The web server".
"""

import asyncio
import json
import multiprocessing
import socket
import struct
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase
from uvicorn.protocols.http.flow_control import FlowControl
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
    app_concurrency: int = 4
    # A body up to this size is read in full before its request enters Django (a slow body
    # then holds no thread); a larger one streams in as Django reads it (Django's own limits).
    prefetch_body_bytes: int = 2_621_440
    # All bodies read ahead at once per worker; a request whose body does not fit waits unread.
    prefetch_budget_bytes: int = 64 * 2**20
    # Slots for /healthz and for static files, beside app_concurrency's.
    health_slots: int = 2
    static_slots: int = 16
    # A response the client does not take: writes stalled this long at once, or in all on one
    # request, abort the connection.
    send_timeout_s: float = 10.0
    response_timeout_s: float = 60.0
    # A request's line and headers in all, in bytes; a longer head gets 431, unread.
    max_head_bytes: int = 65_536
    # Requests parsed and queued behind the one running on a connection before reads pause.
    max_pipelined_requests: int = 16


DEADLINES = Deadlines()

# Seconds a request waits for a database connection from its worker's pool (controlplane/asgi.py).
DATABASE_WAIT_S = 2.0


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


def error_body(path: str, status: int) -> tuple[bytes, bytes]:
    """(body, content type) of an error the server answers before Django: JSON under /api/, as
    controlplane.api.middleware answers the API's errors; plain text elsewhere."""
    from controlplane.api.middleware import API_PREFIX, CODES, DETAILS

    if path.startswith(API_PREFIX):
        return json.dumps({"error": CODES[status], "detail": DETAILS[status]}).encode(), b"application/json"
    return DETAILS[status].encode() + b"\n", b"text/plain; charset=utf-8"


class ConnectionShare:
    """The connections each of gunicorn's workers holds, counted in memory the master shares
    with them before they fork, so that a worker holding more than its share answers a request
    on a kept-alive connection with ``connection: close``: its client reconnects, and the
    worker that accepts first, most likely a less busy one, takes it. A client keeps the worker
    that accepted its connection for as long as it keeps the connection (an SDK, a proxy's
    pool), and twenty at once split between two workers as they came (7 and 13 in one run),
    the busier worker's requests then as much slower as it held more
    (docs/evaluation/fleet-scale.md). A worker's share is the workers' mean, rounded up; a
    worker started outside gunicorn, or without a slot, has none and keeps every connection."""

    def __init__(self) -> None:
        # Per slot: 0 no worker, else 1 + the connections its worker holds. Each worker writes
        # its own slot only; reading the others' unlocked is as good as a share needs.
        self.counts: Any = None
        self.slot: int | None = None
        self.leaving = 0  # this worker's connections handed back, still open

    def allocate(self, slots: int) -> None:
        """In the master, before any worker forks (once: a reload keeps the counts)."""
        if self.counts is None:
            self.counts = multiprocessing.RawArray("q", slots)

    def free_slot(self, taken: Iterable[int | None]) -> int | None:
        """In the master, for a worker about to fork: a slot no live worker holds, or None."""
        if self.counts is None:
            return None
        return min(set(range(len(self.counts))) - set(taken), default=None)

    def join(self, slot: int | None) -> None:
        """In a new worker, once it is about to accept: its slot, holding no connection yet."""
        self.slot, self.leaving = slot, 0
        if slot is not None:
            self.counts[slot] = 1

    def leave(self, slot: int | None) -> None:
        """In the master, once the worker of `slot` has exited."""
        if slot is not None and self.counts is not None:
            self.counts[slot] = 0

    def depart(self) -> None:
        """In a worker that stops: out of the counts at once, not when the master reaps it (a
        stopping worker accepts nothing, and one counted holding none would have the others
        hand back connections that only they can take)."""
        if self.slot is not None:
            self.counts[self.slot] = 0
            self.slot = None

    def opened(self) -> None:
        if self.slot is not None:
            self.counts[self.slot] += 1

    def closed(self, handed_back: bool) -> None:
        if self.slot is not None:
            self.counts[self.slot] -= 1
            self.leaving -= handed_back

    def hand_back(self) -> bool:
        """Whether this worker, less the connections it is handing back already, holds more
        than its share; if so one more is being handed back (closed after its answer)."""
        if self.slot is None:
            return False
        live = [n - 1 for n in self.counts if n]
        if len(live) < 2 or self.counts[self.slot] - 1 - self.leaving <= -(-sum(live) // len(live)):
            return False
        self.leaving += 1
        return True


SHARE = ConnectionShare()


class PipelineFlowControl(FlowControl):
    """Uvicorn's read flow control, with reads kept paused while ``max_pipelined_requests`` wait.

    Uvicorn pauses reads when a request is queued behind another, but resumes them whenever the
    running request awaits its body (Django and BoundedApp always do) or its response ends, however
    many wait: a client pipelining requests it never reads the answers to had a worker take 116 MB
    of them in 4 s, held as queued requests."""

    def __init__(self, transport: asyncio.Transport, protocol: "DeadlineProtocol") -> None:
        super().__init__(transport)
        self.protocol = protocol

    def resume_reading(self) -> None:
        if len(self.protocol.pipeline) < DEADLINES.max_pipelined_requests:
            super().resume_reading()
            if self.protocol.held:  # what was read before the queue filled, parsed now
                self.protocol.loop.call_soon(self.protocol.data_received, b"")


class DeadlineProtocol(HttpToolsProtocol):
    """Uvicorn's httptools protocol with a header deadline and a body deadline."""

    deadline: asyncio.TimerHandle | None = None
    send_deadline: asyncio.TimerHandle | None = None
    stalled_since: float | None = None
    stalled_s = 0.0  # writes stalled so far on this request
    reading_head = True  # from the end of a request (or the connection's start) to its headers' end
    head_bytes = 0  # bytes given to the parser since the head began, its end or the last body bytes
    url = b""  # uvicorn's, set when a request begins
    held = b""  # bytes read but not parsed while the pipeline was full (one read at most)
    refuse_head = False  # a head over the limit waits for the answers before it to get its 431
    handed_back = False  # to be closed after its answer, for another worker to take (ConnectionShare)

    def pause_writing(self) -> None:
        super().pause_writing()
        self.stalled_since = self.loop.time()
        left = min(DEADLINES.send_timeout_s, DEADLINES.response_timeout_s - self.stalled_s)
        self.send_deadline = self.loop.call_later(max(left, 0.0), self._not_taken)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._end_stall()

    def _end_stall(self) -> None:
        if self.stalled_since is not None:
            self.stalled_s += self.loop.time() - self.stalled_since
            self.stalled_since = None
        if self.send_deadline is not None:
            self.send_deadline.cancel()
            self.send_deadline = None

    def _not_taken(self) -> None:
        self.send_deadline = None
        self.logger.info("%s: response not taken in time, aborting", self.client)
        if self.cycle is not None:
            self.cycle.disconnected = True  # the app's next sends return at once
        sock = self.transport.get_extra_info("socket")
        if sock is not None:  # a reset: the kernel drops what it still holds for the client
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()  # close() would wait for the buffer to drain

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
        self.flow = PipelineFlowControl(transport, self)
        self._arm(DEADLINES.header_timeout_s, "headers")
        SHARE.opened()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.stalled_s = 0.0
        if self.deadline is None:  # a kept-alive connection's next request starts its clock
            self._arm(DEADLINES.header_timeout_s, "headers")

    # uvicorn (and httptools, for one header's name and value) keep a head whole in memory however
    # long it is; the header deadline bounds its time, not its size (a fast client sends gigabytes
    # in 10 s). A chunked body's trailer is headers too, read after the head, and httptools grows
    # one trailer value by concatenation (quadratic: 80 MB blocked a worker past gunicorn's 30 s
    # timeout). So bytes reach the parser max_head_bytes at a time, and a run of that many
    # without body bytes (on_body resets the count) is a head or trailer too large.
    def data_received(self, data: bytes) -> None:
        data, self.held = self.held + data, b""
        while data and not self.transport.is_closing():
            if len(self.pipeline) >= DEADLINES.max_pipelined_requests:
                self.held = data  # parsed once the queue is shorter (PipelineFlowControl)
                self.flow.pause_reading()
                return
            room = DEADLINES.max_head_bytes - self.head_bytes
            if room <= 0:
                return self._head_too_large()
            piece, data = data[:room], data[room:]
            self.head_bytes += len(piece)
            super().data_received(piece)  # may complete the head: the rest is its body

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self.head_bytes = 0  # the body progresses: what counts is what follows it

    def _head_too_large(self) -> None:
        self._disarm()
        self.held = b""  # nothing more of this connection is parsed
        if self.reading_head and self.cycle is not None and not self.cycle.response_complete:
            # Requests before this head are still being answered: their answers first, then the
            # 431 (on_response_complete), else the client would read it as theirs.
            self.refuse_head = True
            self.flow.pause_reading()
            return
        self.logger.info("%s: request head over %d bytes, closing", self.client, DEADLINES.max_head_bytes)
        if not self.reading_head and self.cycle is not None and self.cycle.response_started:
            self.transport.close()  # a trailer after the app answered: no second status line
            return
        body, kind = error_body(self.url.decode("latin-1"), 431)
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: %s\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (kind, len(body), body)
        )
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.refuse_head and self.cycle.response_complete and not self.pipeline:
            self.refuse_head = False
            self._head_too_large()  # the requests before it answered: now its 431

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self.reading_head, self.head_bytes = False, 0
        self._arm(DEADLINES.body_timeout_s, "body")
        if SHARE.slot is not None and self.cycle is not None:
            self._may_hand_back(self.cycle)

    def _may_hand_back(self, cycle: Any) -> None:
        """Decide at the start of `cycle`'s answer whether the connection goes back: only when
        nothing of a next request has come in (queued, held or begun), which would be dropped
        with it; a request that comes after its `connection: close` is the client's to retry."""
        send = cycle.send

        async def send_handing_back(message: Message) -> None:
            if (
                message["type"] == "http.response.start"
                and cycle is self.cycle
                and cycle.keep_alive
                and not (self.handed_back or self.pipeline or self.held or self.head_bytes)
                and SHARE.hand_back()
            ):
                self.handed_back = True
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        cycle.send = send_handing_back  # what uvicorn gives the app (run_asgi reads it per cycle)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()
        self.reading_head, self.head_bytes = True, 0  # what follows is the next request's head

    def shutdown(self) -> None:
        SHARE.depart()  # the worker stops: it takes no more connections, so counts in no mean
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._end_stall()
        SHARE.closed(self.handed_back)
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


class ByteBudget:
    """Bytes that requests may hold at once; a request asks for its share and waits for it (one
    alone always gets it, so a share larger than the whole budget cannot wait for ever)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._changed = asyncio.Condition()

    async def take(self, share: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.used == 0 or self.used + share <= self.total)
            self.used += share

    async def give_back(self, share: int) -> None:
        async with self._changed:
            self.used -= share
            self._changed.notify_all()


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length; None for a chunked body (or a bad length, which the HTTP
    parser has refused already)."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
        if name == b"transfer-encoding":
            return None
    return 0


async def too_large(scope: Scope, send: Send) -> None:
    """413, closing the connection: the rest of the body is never read."""
    body, kind = error_body(scope.get("path", ""), 413)
    headers = [(b"content-type", kind), (b"content-length", b"%d" % len(body)), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BoundedApp:
    """An ASGI app that lets at most ``app_concurrency`` requests into ``app`` at once, each
    with its body already read (up to ``prefetch_body_bytes``); /healthz and static files
    (``static_prefix``) have slots of their own; a body over ``max_body_bytes`` gets 413."""

    def __init__(
        self, app: App, *, max_body_bytes: int | None = None, static_prefix: str | None = None
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.static_prefix = static_prefix
        self._slots: dict[str, asyncio.Semaphore] = {}  # made in the worker's event loop
        self._budget: ByteBudget | None = None

    def slots_for(self, path: str) -> asyncio.Semaphore:
        if path == "/healthz":
            kind, size = "health", DEADLINES.health_slots
        elif self.static_prefix and path.startswith(self.static_prefix):
            kind, size = "static", DEADLINES.static_slots
        else:
            kind, size = "app", DEADLINES.app_concurrency
        if kind not in self._slots:
            self._slots[kind] = asyncio.Semaphore(size)
        return self._slots[kind]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        declared = declared_length(scope)
        if limit is not None and declared is not None and declared > limit:
            await too_large(scope, send)
            return
        # What this request's body may hold while it waits: its length, or all a chunked one may.
        share = min(
            DEADLINES.prefetch_body_bytes,
            declared if declared is not None else (limit if limit is not None else 2**63),
        )
        if self._budget is None:
            self._budget = ByteBudget(DEADLINES.prefetch_budget_bytes)
        budget = self._budget
        await budget.take(share)
        try:
            early: list[Message] = []
            size = 0
            while size <= DEADLINES.prefetch_body_bytes:
                message = await receive()
                early.append(message)
                if message["type"] != "http.request":
                    break
                size += len(message.get("body", b""))
                if limit is not None and size > limit:
                    await too_large(scope, send)
                    return
                if not message.get("more_body", False):
                    break
            if early[-1]["type"] == "http.disconnect":
                return  # gone before its request was in: nothing to answer

            async def replay() -> Message:
                return early.pop(0) if early else await receive()

            async with self.slots_for(scope.get("path", "")):
                await self.app(scope, replay, send)
        finally:
            await budget.give_back(share)


class OneHopHandler(ASGIHandler):
    """Django's ASGI handler, with the middleware chain and the view run as under WSGI: all of
    it in one hop from the event loop to the request's thread. Every view here is sync, and so
    are some middlewares (whitenoise's, ours); Django's async chain crossed between the loop and
    the thread around each of them and each sync hook, a quarter of a cheap API call's CPU
    (docs/evaluation/fleet-scale.md). Reading the body, the request_started and
    request_finished signals and sending the response stay Django's."""

    def __init__(self) -> None:  # not ASGIHandler.__init__, which loads the chain as async
        self.load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)
