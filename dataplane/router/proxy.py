"""Forward one request to one pod and stream the answer back: the exchange between sockets.

``Exchange`` is the sink of an upstream connection: the pod's response head becomes the client's
response head (hop-by-hop headers dropped, framing redone), and what the pod produced is priced
(``Delivery``) from the engine's ``usage``:

- an event stream (``text/event-stream``) passes through event by event, unbuffered, read by
  ``stream_usage.StreamUsage`` (the usage chunk, the tokens delivered when it never comes);
- a JSON answer up to ``max_buffer_bytes`` is held whole, so that its price from ``usage`` goes
  out in the head as ``x-mu-cost`` (with a Content-Length); a larger one passes through, without;
- anything else passes through, searched read by read for its ``usage`` (``UsageScan``).

``pod_body`` is the one place the request body is rewritten for the pod.

Failure semantics (the caller retries on ``UpstreamFailed(before_response=True)`` only):
  connect refused / timed out, or the connection lost before any response byte
      -> nothing reached the client: safe to try another pod;
  lost after the head was sent -> the client's connection is cut (a truncated stream is
      detectable, a spliced one from another pod would not be): never retried.
A body the pod delimits by closing the connection (no Content-Length, not chunked; RFC 9112
section 6.3) ends cleanly at that close (``upstream_done``, see ``upstream``): the client gets
it re-framed, chunked (or close-delimited to an HTTP/1.0 client), and its usage is read as
for any other body; only a reset, or a close short of the framing, is a lost pod.
A pod silent for ``upstream_read_timeout_s`` is treated as lost (504 before the head).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from dataplane.router.http import ClientConnection
from dataplane.router.pricing import Coefficients, metered
from dataplane.router.stream_usage import StreamUsage, mu_text, usage_counts
from dataplane.router.upstream import UpstreamConnection
from dataplane.router.validation import lax_bool

# Hop-by-hop headers (RFC 9110 7.6.1) and the framing we redo ourselves.
HOP_BY_HOP = frozenset(
    b"connection keep-alive proxy-connection transfer-encoding te trailer upgrade content-length".split()
)
# Not forwarded to the pod: also the tenant's secret (pods sit on a private network and
# authenticate the router, not tenants) and what only concerns the client-router hop.
REQUEST_DROP = HOP_BY_HOP | {b"host", b"authorization", b"proxy-authorization", b"expect"}
# Not forwarded to the client: the pod's date/server say nothing useful about the router.
RESPONSE_DROP = HOP_BY_HOP | {b"date", b"server"}

# The answer's usage object: the key "usage" with an object value. Every quote inside a JSON
# string is escaped, so a decoded token "usage" (prompt_logprobs) never matches, nor "usage":null.
_USAGE_KEY = re.compile(rb'"usage"\s{0,4}:\s{0,4}\{')
USAGE_OVERLAP = 16  # bytes of a read kept for the next: a key split across reads (the key is 17 at most)
USAGE_SPAN = 512  # bytes after the key read for its counts (vLLM's usage object is ~150)


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


_ASK_USAGE = b'"stream_options":{"include_usage":true},'


def pod_body(raw: bytes, body: dict[str, Any]) -> tuple[bytes, bool]:
    """(the body to forward, whether the router asked for the stream's usage itself).

    A stream whose client did not set ``stream_options.include_usage`` gets it (and
    ``continuous_usage_stats`` off, which the client did not get either), so the engine reports
    what it produced; ``StreamUsage`` then drops that usage chunk. Without ``stream_options`` the
    field goes in as bytes after the opening brace (no re-serialising); else the body is dumped
    again. A ``stream_options`` that is not an object is the engine's to refuse: left as it is.
    ``stream`` and ``include_usage`` are read as vLLM reads them (``validation.lax_bool``: 1,
    "true", "yes" are true); a ``continuous_usage_stats`` of the client's is set off whatever it
    says when the router asks for usage, and left to the engine when the client asked.
    A stream's ``stream_interval`` (vLLM: tokens batched per chunk) is dropped: a stream cut
    early is priced a token a chunk, and a client must not make its chunks cheaper.
    """
    if lax_bool(body.get("stream")) is not True:  # "stream": 1 or "true" is a stream to vLLM
        return raw, False
    options = body.get("stream_options", _ASK_USAGE)
    if options is not _ASK_USAGE and options is not None and not isinstance(options, dict):
        return raw, False
    batched = "stream_interval" in body
    if isinstance(options, dict) and lax_bool(options.get("include_usage")) is True:
        return (_dumped(body, None), False) if batched else (raw, False)
    if options is _ASK_USAGE and not batched:
        i = raw.find(b"{")
        if raw[:i].strip() == b"":
            return raw[: i + 1] + _ASK_USAGE + raw[i + 1 :], True
    asked = {
        **(options if isinstance(options, dict) else {}),
        "include_usage": True,
        "continuous_usage_stats": False,
    }
    return _dumped(body, asked), True


def _dumped(body: dict[str, Any], stream_options: dict[str, Any] | None) -> bytes:
    """``body`` as JSON without ``stream_interval``, with ``stream_options`` when given."""
    out = {k: v for k, v in body.items() if k != "stream_interval"}
    if stream_options is not None:
        out["stream_options"] = stream_options
    return json.dumps(out, separators=(",", ":")).encode()


class Delivery:
    """What one request got from its pod, for its price (``pricing.metered``): the engine's usage
    when it reported it, else the output tokens passed on to the client (``stream_usage``), else
    the admission estimate when the answer came without usage."""

    __slots__ = (
        "answered",
        "chat",
        "client_cut",
        "coefficients",
        "estimated_input_tokens",
        "estimated_output_tokens",
        "hide_usage",
        "sent",
        "status",
        "tokens_out",
        "usage",
    )

    def __init__(
        self,
        coefficients: Coefficients,
        estimated_input_tokens: int,
        hide_usage: bool,
        chat: bool,
        estimated_output_tokens: int = 0,
    ) -> None:
        self.chat = chat  # /v1/chat/completions: a stream opens with role chunks
        self.coefficients = coefficients
        self.estimated_input_tokens = estimated_input_tokens
        self.estimated_output_tokens = estimated_output_tokens  # the most it may generate
        self.answered = False  # a whole non-streamed answer came (with its usage or not)
        self.client_cut = False  # sent to a pod, then its client went away
        self.sent = False  # the request went to a pod (the last attempt's, or an earlier one)
        self.hide_usage = hide_usage  # the router asked for the stream's usage chunk
        self.status = 0
        self.usage: tuple[int, int] | None = None  # (prompt, completion) tokens
        self.tokens_out = 0  # output tokens delivered (streams)

    def price(self) -> tuple[float, int, int]:
        """(MU, input tokens, output tokens) it is metered at."""
        return metered(
            self.coefficients,
            (self.estimated_input_tokens, self.estimated_output_tokens),
            self.usage,
            self.tokens_out,
            self.status,
            answered=self.answered,
            client_cut=self.client_cut,
        )

    def exact(self, prompt_tokens: int, completion_tokens: int) -> float:
        return self.coefficients.cost(prompt_tokens, completion_tokens)


def parse_usage(body: bytes) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) of the usage object of a whole answer, when reported:
    wherever it sits (chat puts prompt_logprobs and prompt_token_ids after it). What
    ``UsageScan`` reads from one read, searched in place (no scanner, no copies): the counts within
    ``USAGE_SPAN`` bytes from the first usage object's brace."""
    m = _USAGE_KEY.search(body)
    if m is None:
        return None
    start = m.end() - 1
    return usage_counts(body, start, start + USAGE_SPAN)


class UsageScan:
    """Finds an answer's usage as its bytes pass, read by read: each read is searched for the
    usage key (with the last ``USAGE_OVERLAP`` bytes of the one before); from the key on, only
    up to ``USAGE_SPAN`` bytes are kept, until both counts are read. Then it reads nothing more."""

    __slots__ = ("_kept", "_open", "usage")

    def __init__(self) -> None:
        self.usage: tuple[int, int] | None = None
        self._kept = b""  # the overlap before the key is found, the usage object's bytes after
        self._open = False  # the key was found: _kept starts at the usage object

    def feed(self, data: bytes) -> None:
        if self.usage is not None:
            return
        kept = self._kept + data if self._kept else data
        if not self._open:
            m = _USAGE_KEY.search(kept)
            if m is None:
                self._kept = kept[-USAGE_OVERLAP:]
                return
            kept, self._open = kept[m.end() - 1 :], True
        kept = kept[:USAGE_SPAN]
        usage = usage_counts(kept)
        if usage is not None:
            self.usage, self._kept = usage, b""
        elif len(kept) >= USAGE_SPAN:  # no counts in its usage object: not reported
            self._open, self._kept = False, b""
        else:
            self._kept = kept

    def end(self) -> tuple[int, int] | None:
        """The usage, once the answer ended."""
        return self.usage


def _joined(chunks: list[bytes] | tuple[()]) -> bytes:
    """The chunks as one bytes: the one chunk itself (most answers come in one read), no copy."""
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class Exchange:
    __slots__ = (
        "body_started",
        "buffer",
        "buffered",
        "client",
        "conn",
        "delivery",
        "done",
        "head",
        "max_buffer_bytes",
        "pending",
        "pod_header",
        "read_timeout_s",
        "response_headers",
        "scan",
        "status",
        "stream",
        "timer",
    )

    def __init__(
        self,
        client: ClientConnection,
        conn: UpstreamConnection,
        pod_header: bytes,
        read_timeout_s: float,
        delivery: Delivery,
        max_buffer_bytes: int,
    ) -> None:
        loop = client.loop
        self.client = client
        self.conn = conn
        self.pod_header = pod_header  # pre-encoded "x-pod: name\r\n"
        self.delivery = delivery
        self.max_buffer_bytes = max_buffer_bytes  # a JSON answer up to this size gets x-mu-cost
        self.head: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.scan: UsageScan | None = None  # a passed-through answer's usage, read as it passes
        self.stream: StreamUsage | None = None  # an event stream's reader
        self.pending = b""  # the stream's events from the pod's current read, not written yet
        self.buffer: list[bytes] | None = None  # a JSON answer held for its price header
        self.buffered = 0  # bytes in buffer
        self.response_headers = b""  # the head's header lines, while the answer is held
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
        self.status = self.delivery.status = status
        length: int | None = None
        content_type = b""
        out = [self.pod_header]
        for k, v in headers:
            lk = k.lower()
            if lk == b"content-length":
                length = int(v) if v.isdigit() else None
            elif lk not in RESPONSE_DROP:
                if lk == b"content-type":
                    content_type = v.lower()
                out.append(b"%s: %s\r\n" % (k, v))
        client = self.client
        client.flow_peer = self.conn
        if content_type.startswith(b"text/event-stream"):
            delivery = self.delivery
            self.stream = StreamUsage(delivery.hide_usage, delivery.exact, delivery.chat)
        elif content_type.startswith(b"application/json") and (length or 0) <= self.max_buffer_bytes:
            self.buffer = []
            self.response_headers = b"".join(out)
        if self.stream is not None:  # its length changes (usage chunk out, fingerprints in)
            length = None
        if self.buffer is None:
            if self.stream is None:
                self.scan = UsageScan()
            client.start_response(status, b"".join(out), length)
            if client.write_paused:
                self.conn.pause_reading()
        self.body_started = True
        if not self.head.done():
            self.head.set_result(None)

    def upstream_body(self, data: bytes) -> None:
        stream = self.stream
        if stream is not None:
            transport = self.client.transport
            if transport is not None and not transport.is_closing():  # gone: nothing more delivered
                # written once per read of the pod (upstream_flush, upstream_done): one syscall
                self.pending += stream.feed(data)
                self.delivery.tokens_out = stream.tokens
            return
        buffer = self.buffer
        if buffer is not None:
            buffer.append(data)
            self.buffered += len(data)
            if self.buffered > self.max_buffer_bytes:  # too large to hold: pass on, unpriced head
                self._send_held(None)
            return
        self.client.write_body(data)
        if self.scan is not None:
            self.scan.feed(data)

    def _send_held(self, price_header: bytes | None, held: bytes | None = None) -> None:
        """The held JSON answer (``held``: its bytes, when already joined): whole with its price
        and length, or (too large) its head and what came so far, the rest following as it
        arrives."""
        if held is None:
            held = _joined(self.buffer or ())
        self.buffer = None
        client = self.client
        if price_header is None:
            client.start_response(self.status, self.response_headers, None)
            self.scan = UsageScan()
            self.scan.feed(held)
        else:
            client.start_response(self.status, self.response_headers + price_header, len(held))
        client.write_body(held)
        if client.write_paused:
            self.conn.pause_reading()

    def upstream_flush(self) -> None:
        if self.pending:
            self.client.write_body(self.pending)
            self.pending = b""
        elif self.buffer is None:
            self.client.flush_head()

    def upstream_done(self) -> None:
        self.cancel_timer()
        delivery = self.delivery
        last = b""
        if self.stream is not None:
            if not self.client.closed:
                last, self.pending = self.pending + self.stream.end(), b""
            delivery.usage, delivery.tokens_out = self.stream.usage, self.stream.tokens
        elif self.buffer is not None:
            held = _joined(self.buffer)
            delivery.usage, delivery.answered = parse_usage(held), True
            mu = delivery.price()[0]
            self._send_held(b"x-mu-cost: %s\r\n" % mu_text(mu).encode(), held)
        else:
            delivery.usage, delivery.answered = (self.scan.end() if self.scan is not None else None), True
        self.client.end_response(last)
        if not self.done.done():
            self.done.set_result(None)

    def upstream_lost(self, exc: BaseException | None) -> None:
        self.cancel_timer()
        if self.stream is not None:
            self.delivery.usage = self.stream.usage  # tokens_out: what was passed on
        reason = f"pod connection lost: {exc!r}"
        if not self.head.done():
            self.head.set_exception(UpstreamFailed(True, reason))
            self.done.set_exception(UpstreamFailed(True, reason))
            self.done.exception()  # mark retrieved: nobody awaits done when head failed
        elif not self.done.done():
            self.done.set_exception(UpstreamFailed(False, reason))
