"""Forward one request to one pod and stream the answer back: the exchange between sockets.

``Exchange`` is the sink of an upstream connection: the pod's response head becomes the client's
response head (hop-by-hop headers dropped, framing redone), and what the pod produced is priced
(``Delivery``) from the engine's ``usage``:

- an event stream (``text/event-stream``) passes through event by event, unbuffered, read by
  ``stream_usage.StreamUsage`` (the usage chunk, the tokens delivered when it never comes);
- a JSON answer up to ``max_buffer_bytes`` is held whole, so that its price from ``usage`` goes
  out in the head as ``x-mu-cost`` (with a Content-Length); a larger one passes through, without;
- anything else passes through, searched read by read for its ``usage`` (``UsageScan``).

``pod_body`` is the one place the request body is rewritten for the pod (a stream's usage asked
for, the tenant's ``cache_salt`` set, a renamed endpoint's served name); ``served_name.AnswerName``
puts the name asked back in a renamed endpoint's answer.

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
import functools
import json
import re
import time
from typing import Any

from dataplane.router.balancer import PodLoad
from dataplane.router.cache_salt import FIELD, check_client_salt, salt_member, salted, tenant_salt
from dataplane.router.http import ClientConnection
from dataplane.router.pricing import CostModel, metered
from dataplane.router.served_name import AnswerName
from dataplane.router.stream_usage import StreamUsage, mu_text, usage_counts
from dataplane.router.upstream import UpstreamConnection
from dataplane.router.usage_details import DETAILS_KEY, NO_DETAILS, prompt_details
from dataplane.router.validation import lax_bool

# Hop-by-hop headers (RFC 9110 7.6.1) and the framing we redo ourselves.
HOP_BY_HOP = frozenset(
    b"connection keep-alive proxy-connection transfer-encoding te trailer upgrade content-length".split()
)
# Not forwarded to the pod: also the tenant's secret (pods authenticate the router, by the fleet
# credential it sends instead, not tenants) and what only concerns the client-router hop.
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


def build_request(
    method: bytes, path: bytes, host: bytes, headers: dict[bytes, bytes], body: bytes, auth: bytes = b""
) -> bytes:
    """The request to a pod; ``auth``: the fleet credential's pre-encoded header line (the
    tenant's own authorization is never forwarded)."""
    out = [b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-length: %d\r\n%s" % (method, path, host, len(body), auth)]
    for k, v in headers.items():
        if k not in REQUEST_DROP:
            out.append(b"%s: %s\r\n" % (k, v))
    out.append(b"\r\n")
    out.append(body)
    return b"".join(out)


# the body's brace, the field
_OPEN_ASKING_USAGE = b'{"stream_options":{"include_usage":true,"continuous_usage_stats":true},'


def pod_body(
    raw: bytes, body: dict[str, Any], tenant: str | None = None, served: str | None = None
) -> tuple[bytes, bool, bool]:
    """(the body to forward, whether the router asked for the stream's usage chunk itself,
    whether it asked for the usage in every chunk itself).

    ``served``: the name the pods serve, when it is not the one the request named (a renamed
    endpoint, ``served_name``): ``body`` names it (changed in place) and is dumped again.

    ``tenant``: the request's (None in static mode: the body keeps the client's salt, if any).
    Its ``cache_salt`` (``cache_salt.salt_member``) goes in, combined with the client's own
    (``cache_salt.salted``, checked by ``check_client_salt``: a 400) when it sent one.

    A stream whose client did not set ``stream_options.include_usage`` gets it, so the engine
    reports what it produced; ``StreamUsage`` then drops that usage chunk. Every stream gets
    ``continuous_usage_stats`` too (the usage so far in every chunk, the prompt's count from the
    first), so a stream cut before its usage chunk is priced at the engine's count of its prompt;
    ``StreamUsage`` takes that usage out of each chunk unless the client asked for it (its
    ``include_usage`` and ``continuous_usage_stats`` both true). The usual body (no
    ``stream_options``, no client ``cache_salt``) gets its new members as bytes after the opening
    brace (no re-serialising); else the body is dumped again. A ``stream_options`` that is not an
    object is the engine's to refuse: left as it is.
    ``stream``, ``include_usage`` and ``continuous_usage_stats`` are read as vLLM reads them
    (``validation.lax_bool``: 1, "true", "yes" are true); the client's ``continuous_usage_stats``
    is the router's to set when the router asks for the usage chunk, and when the client asked
    for it but the field is absent, null or false; a value vLLM refuses is left to the engine.
    A stream's ``stream_interval`` (vLLM: tokens batched per chunk) is dropped: a stream cut
    early is priced a token a chunk, and a client must not make its chunks cheaper.
    """
    if served is not None:
        body["model"] = served
        raw = json.dumps(body).encode()
    if FIELD in body:  # the client's own salt (most requests send none), as vLLM reads it
        client = check_client_salt(body[FIELD])
        if tenant is not None:  # combined with the tenant's, in its place: the body is dumped
            ours = {**body, FIELD: salted(tenant_salt(tenant), client)}
            return pod_body(json.dumps(ours, separators=(",", ":")).encode(), ours)
        opening, asking = None, _OPEN_ASKING_USAGE
    elif tenant is None:  # static mode
        opening, asking = None, _OPEN_ASKING_USAGE
    else:
        opening, asking = _salted_openings(tenant)
    stream = body.get("stream")
    # "stream": 1 or "true" is a stream to vLLM; true is, and no false-like value ever is
    if stream is not True and (not stream or lax_bool(stream) is not True):
        return _opened(raw, body, opening), False, False
    batched = "stream_interval" in body
    options = None
    if "stream_options" not in body and not batched:  # the usual stream: the field goes in as bytes
        if _brace_first(raw):
            return raw.replace(b"{", asking, 1), True, True
    else:
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            return _opened(raw, body, opening), False, False
        if options is not None and lax_bool(options.get("include_usage")) is True:
            continuous = options.get("continuous_usage_stats")
            if continuous is None or lax_bool(continuous) is False:
                return _dumped(body, {**options, "continuous_usage_stats": True}, opening), False, True
            if batched:  # the client's own usage in every chunk (or a value vLLM refuses)
                return _dumped(body, None, opening), False, False
            return _opened(raw, body, opening), False, False
    asked = {**(options or {}), "include_usage": True, "continuous_usage_stats": True}
    return _dumped(body, asked, opening), True, True


@functools.cache  # per request: one dict lookup (tenants: the routing table's, a bounded set)
def _salted_openings(tenant: str) -> tuple[bytes, bytes]:
    """A tenant's body openings: its brace and its ``cache_salt``, without and with usage asked."""
    member = salt_member(tenant)
    return b"{" + member, _OPEN_ASKING_USAGE + member


def _brace_first(raw: bytes) -> bool:
    """Whether the body's first non-space byte is its brace (members go in after it as bytes).
    The brace first, as clients send it, is read as a byte (an int), not searched for."""
    return raw[0] == 0x7B or raw[: raw.find(b"{")].isspace()


def _opened(raw: bytes, body: dict[str, Any], opening: bytes | None) -> bytes:
    """``raw`` opening with ``opening`` (a brace and members; None: as it is)."""
    if opening is None:
        return raw
    if _brace_first(raw):  # a body names a model: a member follows the brace
        return raw.replace(b"{", opening, 1)
    return _dumped(body, None, opening)  # e.g. a byte order mark before the brace


def _dumped(
    body: dict[str, Any], stream_options: dict[str, Any] | None, opening: bytes | None = None
) -> bytes:
    """``body`` as JSON without ``stream_interval``, with ``stream_options`` when given, opening
    with ``opening`` (a brace and the tenant's salt) when given."""
    out = {k: v for k, v in body.items() if k != "stream_interval"}
    if stream_options is not None:
        out["stream_options"] = stream_options
    dumped = json.dumps(out, separators=(",", ":")).encode()
    return opening + dumped[1:] if opening else dumped


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
    up to ``USAGE_SPAN`` bytes are kept, until both counts are read, and then until the span is
    full or the answer ends, for the details that follow the counts (``usage_details``). Then it
    reads nothing more."""

    __slots__ = ("_kept", "_open", "details", "usage")

    def __init__(self) -> None:
        self.usage: tuple[int, int] | None = None
        self.details = NO_DETAILS  # (cached, image) prompt tokens (usage_details)
        self._kept = b""  # the overlap before the key is found, the usage object's bytes after
        self._open = False  # the key was found: _kept starts at the usage object

    def feed(self, data: bytes) -> None:
        if self.usage is not None:
            if self._kept:  # the details after the counts, within the span
                self._kept = (self._kept + data)[:USAGE_SPAN]
                if len(self._kept) >= USAGE_SPAN:
                    self.details, self._kept = prompt_details(self._kept), b""
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
            self.usage, self._kept = usage, kept
        elif len(kept) >= USAGE_SPAN:  # no counts in its usage object: not reported
            self._open, self._kept = False, b""
        else:
            self._kept = kept

    def end(self) -> tuple[int, int] | None:
        """The usage, once the answer ended (its details in ``details``)."""
        if self._kept and self.usage is not None:
            self.details, self._kept = prompt_details(self._kept), b""
        return self.usage


class Exchange:
    """One request's exchange with its pods, and what it got for its price (``pricing.metered``):
    the engine's usage when it reported it, else the output tokens passed on to the client
    (``stream_usage``), else the admission estimate when the answer came without usage.

    Made once per request; ``send`` sends it to a pod, again to another on a retry. A retry
    follows only an attempt that got no response byte, so the answer's state is still new then.
    """

    __slots__ = (
        "answer_name",
        "answered",
        "buffer",
        "buffered",
        "chat",
        "client",
        "client_cut",
        "coefficients",
        "conn",
        "details",
        "done",
        "estimate",
        "failed",
        "head",
        "hide_usage",
        "image_tokens",
        "max_buffer_bytes",
        "pending",
        "pod_header",
        "priced",
        "read_timeout_s",
        "refused",
        "response_headers",
        "scan",
        "sent",
        "single_prompt",
        "status",
        "stream",
        "strip_usage",
        "timer",
        "unanswered",
        "unanswered_mu",
        "usage",
    )

    def __init__(
        self,
        client: ClientConnection,
        coefficients: CostModel,
        estimate: tuple[int, int],
        hide_usage: bool,
        chat: bool,
        read_timeout_s: float,
        max_buffer_bytes: int,
        image_tokens: int = 0,
        strip_usage: bool = False,
        single_prompt: bool = True,
        answer_name: AnswerName | None = None,
    ) -> None:
        self.client = client
        self.coefficients = coefficients
        self.estimate = estimate  # the admission's (input tokens, the most output tokens)
        self.hide_usage = hide_usage  # the router asked for the stream's usage chunk
        self.strip_usage = strip_usage  # the router asked for the usage in every chunk
        # one prompt (chat, or one completions prompt): a chunk's usage counts all of it
        self.single_prompt = single_prompt
        self.chat = chat  # /v1/chat/completions: a stream opens with role chunks
        self.read_timeout_s = read_timeout_s
        self.max_buffer_bytes = max_buffer_bytes  # a JSON answer up to this size gets x-mu-cost
        self.answer_name = answer_name  # a renamed endpoint's: the name asked put back; else None
        self.sent = False  # the request went to a pod (the last attempt's, or an earlier one)
        self.client_cut = False  # sent to a pod, then its client went away
        self.failed = False  # ended for the platform's reasons (a router's cut, a stalled pod)
        self.answered = False  # a whole non-streamed answer came (with its usage or not)
        self.status = 0
        self.usage: tuple[int, int] | None = None  # (prompt, completion) tokens
        self.details = NO_DETAILS  # (cached, image) prompt tokens of the usage, when reported
        self.image_tokens = image_tokens  # the router's count of the request's image tokens
        self.priced: tuple[float, int, int] | None = None  # a held answer's price, sent in its head
        self.scan: UsageScan | None = None  # a passed-through answer's usage, read as it passes
        self.stream: StreamUsage | None = None  # an event stream's reader
        self.pending = b""  # the stream's events from the pod's current read, not written yet
        self.buffer: list[bytes] | None = None  # a JSON answer held for its price header
        self.buffered = 0  # bytes in buffer
        self.response_headers = b""  # the head's header lines, while the answer is held
        # the current attempt's
        self.conn: UpstreamConnection | None = None
        self.pod_header = b""  # pre-encoded "x-pod: name\r\n"
        self.head: asyncio.Future[None] | None = None  # the response head came (or it failed)
        self.done: asyncio.Future[None] | None = None  # the answer ended (or it failed)
        self.timer: asyncio.TimerHandle | None = None
        # the pod that has sent no byte of its answer yet (its balancing load counts it again)
        self.unanswered: PodLoad | None = None
        self.unanswered_mu = 0.0
        # A pod's 401 refuses the router's fleet key, never the tenant's (whose key the pod never
        # sees): it is not passed on; ``refused`` says it came, its answer read and dropped, and
        # the router tries the next key (a rotation) or answers 502 itself.
        self.refused = False

    def send(
        self, conn: UpstreamConnection, pod_header: bytes, request: bytes
    ) -> tuple[asyncio.Future[None], asyncio.Future[None]]:
        """Send ``request`` on ``conn`` (a pod's, ``pod_header`` its x-pod line); (head, done): the
        futures of this attempt, its response head and its end (or its failure)."""
        loop = self.client.loop
        self.conn, self.pod_header = conn, pod_header
        head = self.head = loop.create_future()
        done = self.done = loop.create_future()
        self.timer = loop.call_later(self.read_timeout_s, self._check_timeout)
        self.refused = False
        conn.send(request, self)
        self.sent = True
        return head, done

    def price(self) -> tuple[float, int, int]:
        """(MU, input tokens, output tokens) it is metered at."""
        if self.priced is not None:
            return self.priced
        usage = self.usage
        if usage is not None:  # metered's first rule, the usual one, without the call that decides it
            stream = self.stream
            cached, images = self.details if stream is None else stream.details
            prompt, completion = usage  # (no list built for the result, as *usage would)
            return (
                self.coefficients.cost(prompt, completion, cached, images or self.image_tokens),
                prompt,
                completion,
            )
        stream = self.stream
        return metered(
            self.coefficients,
            self.estimate,
            None,
            stream.tokens if stream is not None else 0,
            self.status,
            answered=self.answered,
            client_cut=self.client_cut,
            details=stream.details if stream is not None else self.details,
            image_tokens=self.image_tokens,
            prompt_tokens=stream.prompt_tokens if stream is not None and self.single_prompt else None,
            failed=self.failed or (stream is not None and stream.failed),
        )

    def _usage_price(self, prompt_tokens: int, completion_tokens: int) -> float:
        """A stream's price from its usage chunk (its details read just before)."""
        assert self.stream is not None
        cached, images = self.stream.details
        return self.coefficients.cost(prompt_tokens, completion_tokens, cached, images or self.image_tokens)

    def _check_timeout(self) -> None:
        conn = self.conn
        assert conn is not None
        now = time.monotonic()
        if conn.paused and now - conn.paused_since >= self.read_timeout_s:
            # Its client has read nothing for as long as a pod may be silent: the client's
            # stall, so the client is cut (and the stream billed as its cut), not the pod.
            self.timer = None
            self.client.abort()
            return
        idle = conn.silent_s(now)
        if idle >= self.read_timeout_s:
            self.timer = None
            conn.sink = None
            conn.close()
            self.upstream_lost(TimeoutError(f"pod silent for {idle:.1f} s"))
        else:  # activity since, or reading paused: re-arm (one timer, not one per chunk)
            wait = self.read_timeout_s - (now - conn.paused_since if conn.paused else idle)
            self.timer = self.client.loop.call_later(wait, self._check_timeout)

    def pod_silent_s(self) -> float:
        """Seconds since the pod's last byte (since the request went out when none came), not
        counting while the router stopped reading it for a client that did not read."""
        return self.conn.silent_s(time.monotonic()) if self.conn is not None else 0.0

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    # --- Sink
    def upstream_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        if status == 401:  # the pod refused the fleet key (or is on the other one, rotating)
            self.refused = True
            if self.conn is not None:
                self.conn.sink = _Dropped(self)  # its body read and dropped, off the hot path
            head = self.head
            if head is not None and not head.done():
                head.set_result(None)
            return
        self.status = status
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
            self.stream = StreamUsage(self.hide_usage, self._usage_price, self.chat, self.strip_usage)
            # its length changes (usage chunk out, fingerprints in): re-framed
            client.start_response(status, b"".join(out), None)
        elif content_type.startswith(b"application/json") and (length or 0) <= self.max_buffer_bytes:
            self.buffer = []
            self.response_headers = b"".join(out)
        else:
            self.scan = UsageScan()
            # a renamed endpoint's answer changes length: re-framed
            client.start_response(status, b"".join(out), length if self.answer_name is None else None)
        if self.buffer is None and client.write_paused:
            self._pause_pod()
        head = self.head
        if head is not None and not head.done():
            head.set_result(None)

    def upstream_body(self, data: bytes) -> None:
        if self.unanswered is not None:  # the answer's first byte: a stream's first token
            self.unanswered.answering(self.unanswered_mu)
            self.unanswered = None
        stream = self.stream
        if stream is not None:
            transport = self.client.transport
            if transport is not None and not transport.is_closing():  # gone: nothing more delivered
                # written once per read of the pod (upstream_flush, upstream_done): one syscall
                events = stream.feed(data)
                self.pending += events if self.answer_name is None else self.answer_name.whole(events)
            return
        buffer = self.buffer
        if buffer is not None:
            buffer.append(data)
            self.buffered += len(data)
            if self.buffered > self.max_buffer_bytes:  # too large to hold: pass on, unpriced head
                self._pass_held()
            return
        self.client.write_body(data if self.answer_name is None else self.answer_name.feed(data))
        if self.scan is not None:
            self.scan.feed(data)

    def _pass_held(self) -> None:
        """A JSON answer too large to hold: its head (no price, no length) and what came so far;
        the rest follows as it arrives, searched for its usage as it passes."""
        held = b"".join(self.buffer or ())
        self.buffer = None
        self.client.start_response(self.status, self.response_headers, None)
        self.scan = UsageScan()
        self.scan.feed(held)
        self.client.write_body(held if self.answer_name is None else self.answer_name.feed(held))
        if self.client.write_paused:
            self._pause_pod()

    def _pause_pod(self) -> None:
        if self.conn is not None:
            self.conn.pause_reading()

    def upstream_flush(self) -> None:
        if self.pending:
            self.client.write_body(self.pending)
            self.pending = b""
        elif self.buffer is None:
            self.client.flush_head()

    def upstream_done(self) -> None:
        self.cancel_timer()
        client = self.client
        stream = self.stream
        if stream is not None:
            last = b""
            if not client.closed:
                rest = stream.end()
                if self.answer_name is not None:
                    rest = self.answer_name.whole(rest)
                last, self.pending = self.pending + rest, b""
            self.usage = stream.usage
            client.end_response(last)
        elif self.buffer is not None:  # held whole: sent with its price and length, in one write
            buffer, self.buffer = self.buffer, None
            held = buffer[0] if len(buffer) == 1 else b"".join(buffer)  # most come in one read
            self.usage, self.answered = parse_usage(held), True
            if self.usage is not None and DETAILS_KEY in held:  # most answers: none, no call
                self.details = prompt_details(held)
            self.priced = self.price()
            price_header = b"x-mu-cost: %s\r\n" % mu_text(self.priced[0]).encode()
            if self.answer_name is not None:
                held = self.answer_name.whole(held)
            client.send_response(self.status, self.response_headers + price_header, held)
        else:
            self.usage, self.answered = (self.scan.end() if self.scan is not None else None), True
            if self.scan is not None:
                self.details = self.scan.details
            client.end_response(b"" if self.answer_name is None else self.answer_name.end())
        done = self.done
        if done is not None and not done.done():
            done.set_result(None)

    def upstream_lost(self, exc: BaseException | None) -> None:
        self.cancel_timer()
        if self.stream is not None:
            self.usage = self.stream.usage  # tokens: what was passed on
        reason = f"pod connection lost: {exc!r}"
        head, done = self.head, self.done
        if head is None or done is None:
            return
        if not head.done():
            head.set_exception(UpstreamFailed(True, reason))
            done.set_exception(UpstreamFailed(True, reason))
            done.exception()  # mark retrieved: nobody awaits done when head failed
        elif not done.done():
            done.set_exception(UpstreamFailed(False, reason))


class _Dropped:
    """The sink of a pod's refusal of the router's fleet key: nothing of it reaches the client;
    its end (or loss) ends the exchange's attempt."""

    __slots__ = ("exchange",)

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange

    def upstream_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        pass

    def upstream_body(self, data: bytes) -> None:
        pass

    def upstream_flush(self) -> None:
        pass

    def upstream_done(self) -> None:
        self.exchange.cancel_timer()
        done = self.exchange.done
        if done is not None and not done.done():
            done.set_result(None)

    def upstream_lost(self, exc: BaseException | None) -> None:
        self.upstream_done()  # the retry takes a fresh connection: this one is closed
