"""What a completions stream delivered, read as its server-sent events pass through. Pure: no I/O.

vLLM (0.32, ``completion_stream_generator`` / ``chat_completion_stream_generator``) sends each
chunk as one ``data: {json}\\n\\n`` event holding one choice, one generated token per chunk by
default; with ``stream_options.include_usage`` a final chunk with ``"choices": []`` carries the
whole ``usage``, just before ``data: [DONE]``. With include_usage it stamps ``system_fingerprint``
on that usage chunk only; without it, on each choice's terminal chunk (``finish_reason`` set).

``StreamUsage`` turns the pod's bytes into the client's:

- the router asked for usage (``hide_usage``): the usage chunk is taken and dropped, and each
  terminal chunk gets back the ``system_fingerprint`` vLLM would have stamped on it (copied, bytes
  as sent, from the usage chunk), so the client gets the bytes it would have got from the engine.
  The chunks from the first terminal one on wait for the usage chunk, which follows at once when
  n is 1; with n > 1 the other choices' last chunks wait for the last choice to finish.
- the client asked for usage: the usage chunk passes with ``"mu": <price>`` added to its usage.

Delivered tokens (the price of a stream cut before its usage chunk): one per choice chunk passed
on, except chat's opening chunk (``delta.role``); not the usage chunk, nor ``[DONE]``. That is
vLLM's completion_tokens when it streams a token per chunk (its default): a chunk vLLM merges
(``--stream-interval`` > 1, speculative decoding) counts once, chat's echoed text counts one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

# Read from the bytes, not parsed: every quote inside a JSON string is escaped, so these keys
# match only as keys, in vLLM's compact dump and in a spaced one alike. Only the usage chunk (one
# a stream) is parsed.
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')  # the usage chunk
_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"')  # a choice's terminal chunk (else null)
_FINGERPRINT = re.compile(rb',\s*"system_fingerprint"\s*:\s*"(?:[^"\\]|\\.)*"')
_DECODER = json.JSONDecoder()

Pricer = Callable[[int, int], float]  # (prompt tokens, completion tokens) -> MU


def mu_text(mu: float) -> str:
    """A price as a short decimal: 1.08 -> "1.08", 4.1000000001 -> "4.1", 0 -> "0"."""
    text = f"{mu:.6f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


class StreamUsage:
    __slots__ = ("_buf", "_held", "hide_usage", "price", "tokens", "usage")

    def __init__(self, hide_usage: bool, price: Pricer) -> None:
        self.hide_usage = hide_usage  # the router added include_usage: the client never sees it
        self.price = price
        self.tokens = 0  # output tokens in the chunks passed on
        self.usage: tuple[int, int] | None = None  # (prompt, completion) of the usage chunk
        self._buf = b""  # an event not complete yet
        self._held: list[tuple[bytes, int, bool]] = []  # (event, tokens, terminal) awaiting usage

    def feed(self, data: bytes) -> bytes:
        """The bytes to pass on for ``data`` from the pod: whole events only."""
        buf = self._buf + data if self._buf else data
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return b""
        end += 2
        block = buf[:end] if end < len(buf) else buf
        self._buf = buf[end:]
        # Most reads hold only token chunks: counted over the whole block, passed on untouched.
        # Event by event only for the usage chunk, chunks held for it, or a terminal chunk that
        # must wait for it.
        if not self._held and _NO_CHOICES.search(block) is None:
            if not (self.hide_usage and _FINISHED.search(block)):
                self.tokens += _tokens(block)
                return block
        out = []
        start = 0
        while start < end:
            stop = block.index(b"\n\n", start) + 2
            out.append(self._event(block[start:stop]))
            start = stop
        return b"".join(out)

    def end(self) -> bytes:
        """The pod ended the stream: whatever is still held goes out as it came."""
        out = b"".join(e for e, _, _ in self._held) + self._buf
        self.tokens += sum(n for _, n, _ in self._held)
        self._held, self._buf = [], b""
        return out

    def _event(self, event: bytes) -> bytes:
        if _NO_CHOICES.search(event) is not None:
            counts = _usage_of(event)
            if counts is not None:
                self.usage = counts
                return self._release(event) if self.hide_usage else self._with_mu(event)
        terminal = self.hide_usage and _FINISHED.search(event) is not None
        return self._pass(event, _tokens(event), terminal)

    def _pass(self, event: bytes, tokens: int, terminal: bool) -> bytes:
        if terminal or self._held:
            self._held.append((event, tokens, terminal))
            return b""
        self.tokens += tokens
        return event

    def _release(self, usage_event: bytes) -> bytes:
        """The held chunks, each terminal one with the usage chunk's fingerprint, as vLLM sends
        them without include_usage."""
        m = _FINGERPRINT.search(usage_event)
        stamp = m.group(0) if m else b""
        out = []
        for event, tokens, terminal in self._held:
            if terminal and stamp:
                close = event.rindex(b"}")
                event = event[:close] + stamp + event[close:]
            out.append(event)
            self.tokens += tokens
        self._held = []
        return b"".join(out)

    def _with_mu(self, event: bytes) -> bytes:
        """The usage chunk with ``"mu"`` as the last field of its usage object."""
        assert self.usage is not None
        text = event.decode()
        key = text.find('"usage"')
        start = text.index("{", key)
        _, stop = _DECODER.raw_decode(text, start)
        mu = mu_text(self.price(*self.usage))
        sep = "," if text[start + 1 : stop - 1].strip() else ""
        return (text[: stop - 1] + f'{sep}"mu":{mu}' + text[stop - 1 :]).encode()


def _tokens(events: bytes) -> int:
    """Tokens in whole chunks (none of them the usage chunk): one per choice chunk, counted by
    ``choices`` or by ``finish_reason`` (one a choice, null until its last) where a chunk holds
    several, less chat's opening chunks (a ``delta`` that opens with ``role``)."""
    chunks = max(events.count(b'"choices"'), events.count(b'"finish_reason"'))
    return max(0, chunks - events.count(b'{"role"'))


def _usage_of(event: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a usage chunk's ``usage``, when it is one."""
    payload = event[event.find(b"data:") + 5 :].strip()
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    return _counts(obj.get("usage")) if isinstance(obj, dict) else None


def _counts(usage: Any) -> tuple[int, int] | None:
    p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(p, int) and isinstance(c, int) and not isinstance(p, bool) and not isinstance(c, bool):
        return p, c
    return None
