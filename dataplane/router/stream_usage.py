"""What a completions stream delivered, read as its server-sent events pass through. Pure: no I/O.

``StreamUsage`` turns the pod's bytes into the client's: it drops the usage chunk the router asked
for (putting back the ``system_fingerprint`` vLLM would have stamped on each terminal chunk), adds
``"mu": <price>`` to a usage chunk the client asked for, and takes out the continuous usage stats
the client did not ask for. It reads the engine's prompt count from the first chunk, marks a
stream with an error event ``failed``, and counts a cut stream's delivered tokens per choice chunk
as max(1, text bytes // ``MERGED_BYTES_PER_TOKEN``). It follows vLLM 0.32's layout (one
``data: {json}\\n\\n`` event a chunk, usage in a final ``"choices": []`` chunk before ``[DONE]``):
a change there is a change here. Details and why: docs/router.md, "Stream usage".
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from capacity.units import BYTES_PER_TOKEN
from dataplane.router.usage_details import NO_DETAILS, prompt_details

# Read from the bytes, not parsed: every quote inside a JSON string is escaped, so these keys
# match only as keys; found as vLLM's compact dump writes them, or a spaced one (the sim's).
COMPACT = (b'"choices":[]', b'"finish_reason":"', b'"usage":{')  # vLLM's
SPACED = (b'"choices": []', b'"finish_reason": "', b'"usage": {')  # json.dumps's, the sim's
# each: the usage chunk's choices, a choice's terminal chunk (else null), the usage object's key.
# The usage chunk's counts are read from its usage key on: inside vLLM's JSON a count key in a
# string is escaped (\"prompt_tokens\"), and its chunks hold no count key outside usage.
# A usage object's counts, each followed by what ends it (a number split across reads of an
# answer is not read short): the one reading of them, for streams and whole answers alike.
_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)\s*[,}]')
_COMPLETION = re.compile(rb'"completion_tokens"\s*:\s*(\d+)\s*[,}]')
# the usage chunk as vLLM (and the sim, spaced) lays it out: choices, then usage, its counts in order
_VLLM_USAGE = re.compile(
    rb'"choices":\s?\[\],\s?"usage":\s?\{"prompt_tokens":\s?(\d+),\s?"total_tokens":\s?\d+,'
    rb'\s?"completion_tokens":\s?(\d+)\s*[,}]'
)
# A whole usage event in vLLM's compact dump (vLLM writes no other), from its start to its end:
# one match reads the counts, the event's end and the fingerprint (after usage, as vLLM puts it),
# and proves there is no other fingerprint in it, where the general path takes three finds over
# the event and a spaced-tolerant match (each optional space a branch in the regex engine).
# Any other layout takes the general path. The strings before choices are read as [^"]* (the
# regex engine's fastest repeat, a byte compare): an escaped quote in one stops the match there
# (what follows it is no '",' outside the string in valid JSON) and sends it the general way.
_VLLM_USAGE_EVENT = re.compile(
    rb'data: \{"id":"[^"]*","object":"[^"]*","created":\d+,"model":"[^"]*",'
    rb'"choices":\[\],"usage":\{"prompt_tokens":(\d+),"total_tokens":\d+,"completion_tokens":(\d+)\}'
    rb'(,"system_fingerprint":"(?:[^"\\]|\\.)*")?\}\n\n'
)
_FINGERPRINT = re.compile(rb',\s*"system_fingerprint"\s*:\s*"(?:[^"\\]|\\.)*"')
_OPENING = b'{"role"'  # chat's opening delta (no token), in either spelling
# A choice chunk's usage so far (continuous usage stats): it follows the chunk's choices, which
# the usage chunk's are not (empty); an object of counts (vLLM's and the sim's hold no details,
# which only the usage chunk carries). One class repeat: a quarter of the time of nested ones.
_CHUNK_USAGE = re.compile(rb'\}\],\s?"usage":\s?\{[^{}]*\}')
_ERROR_EVENT = b'data: {"error"'  # vLLM's error event: the key opens the event's object
_DECODER = json.JSONDecoder()
MAX_HELD_BYTES = 64 * 1024  # held for the fingerprint at most (n > 1: the other choices' chunks)
# A chunk counts one token per this many bytes of its text (1 at least): bytes as in BYTES_PER_TOKEN,
# not characters, of the JSON string as sent (a \u escape counted one).
MERGED_BYTES_PER_TOKEN = 2 * BYTES_PER_TOKEN
MERGED_SLACK = 2 * MERGED_BYTES_PER_TOKEN  # bytes over one token a chunk that trigger the measure
# a choice's generated text (completions' text, chat's content / reasoning / tool arguments)
_TEXT = re.compile(rb'"(?:text|content|reasoning_content|reasoning|arguments)"\s*:\s*"((?:[^"\\]|\\.)*)"')

Pricer = Callable[[int, int], float]  # (prompt tokens, completion tokens) -> MU


def mu_text(mu: float) -> str:
    """A price as a short decimal: 1.08 -> "1.08", 4.1000000001 -> "4.1", 0 -> "0"."""
    text = f"{mu:.6f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


class StreamUsage:
    __slots__ = (
        "_buf",
        "_held",
        "_holds",
        "_keys",
        "_plain",
        "chat",
        "details",
        "failed",
        "hide_usage",
        "price",
        "prompt_tokens",
        "strip_usage",
        "tokens",
        "usage",
    )

    def __init__(
        self, hide_usage: bool, price: Pricer, chat: bool = False, strip_usage: bool = False
    ) -> None:
        self.hide_usage = hide_usage  # the router added include_usage: the client never sees it
        self.strip_usage = strip_usage  # the router added continuous usage stats: out of each chunk
        self.prompt_tokens: int | None = None  # the engine's count, from the first chunk's usage
        self.failed = False  # an error event came: the engine refused the request, or failed
        self.price = price
        self.chat = chat  # a chat stream: its opening chunks are no tokens
        self._keys: tuple[bytes, bytes, bytes] | None = None  # the spelling, from the first chunk
        self.tokens = 0  # output tokens in the chunks passed on (the usage's once it came)
        self.usage: tuple[int, int] | None = None  # (prompt, completion) of the usage chunk
        self.details = NO_DETAILS  # (cached, image) prompt tokens of the usage chunk (usage_details)
        self._buf = b""  # an event not complete yet
        self._held = b""  # events from the first terminal chunk on, awaiting the usage chunk
        self._plain = 0.0  # the fewest bytes a chunk took in a read (0: none read yet)
        self._holds = hide_usage  # terminal chunks wait for the fingerprint (until MAX_HELD_BYTES)

    def feed(self, data: bytes) -> bytes:
        """The bytes to pass on for ``data`` from the pod: whole events only.

        Read whole (a search or two and a count per read of the pod, whatever it holds), never
        event by event: only the usage chunk is cut out and parsed."""
        buf = self._buf + data if self._buf else data
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return b""
        end += 2
        if end < len(buf):
            block, self._buf = buf[:end], buf[end:]
        else:  # most reads end with an event
            block, self._buf = buf, b""
        if self._keys is None:  # the first whole events: the prompt's count, when they carry usage
            m = _PROMPT.search(block)
            if m is not None:
                self.prompt_tokens = int(m[1])
        if _ERROR_EVENT in block:
            self.failed = True
        if self.strip_usage:
            block = _CHUNK_USAGE.sub(b"}]", block)
        if self._held:
            block, self._held = self._held + block, b""
        if self.usage is None:  # the usage chunk not come yet: it, or a terminal chunk to hold
            keys = self._keys
            if keys is None:  # the first read: the spelling, from vLLM's marker when it is there
                at = block.rfind(COMPACT[0])  # (a stream in one read: no search for the spelling)
                keys = self._keys = COMPACT if at >= 0 else _spelling(block)
                if keys is SPACED:
                    at = block.rfind(SPACED[0])
            else:
                at = block.rfind(keys[0])  # at the end of a stream
            if at >= 0:
                i = block.rfind(b"\n\n", 0, at)
                start = i + 2 if i >= 0 else 0  # the usage event's
                m = _VLLM_USAGE_EVENT.match(block, start) if keys is COMPACT else None
                if m is not None:  # vLLM's: all of it read in one match (the usual end of a stream)
                    completion = int(m[2])
                    self.usage, self.tokens = (int(m[1]), completion), completion  # exact: all of it goes out
                    stop = m.end()
                    if not self.hide_usage:
                        return block[:start] + self._with_mu(block[start:stop]) + block[stop:]
                    stamp = m[3]
                    if stamp is None:  # the usual one: the usage event cut out, nothing to stamp
                        return block[:start] + block[stop:]
                    return _stamped(block[:start], stamp, keys[1]) + block[stop:]
                stop = block.find(b"\n\n", at) + 2
                m = _VLLM_USAGE.match(block, at, stop)  # one reading of both counts, most chunks
                if m is not None:
                    counts: tuple[int, int] | None = (int(m[1]), int(m[2]))
                else:  # another layout: each count from the usage key on
                    key = block.find(keys[2], start, stop)
                    counts = usage_counts(block, key, stop) if key >= 0 else None
                if counts is not None:
                    self.usage, self.tokens = counts, counts[1]  # exact now: all of it goes out
                    self.details = prompt_details(block, start, stop)  # after the counts in vLLM's
                    before, after = block[:start], block[stop:]  # tokens: the usage says them
                    if self.hide_usage:
                        # the regex only where the key is (a chunk without one is the engine's choice)
                        fp = block.find(b'"system_fingerprint"', start, stop)
                        found = _FINGERPRINT.search(block, start, stop) if fp >= 0 else None
                        return (before if found is None else _stamped(before, found[0], keys[1])) + after
                    return before + self._with_mu(block[start:stop]) + after
            if at < 0 and self._holds:
                at = block.find(keys[1])
                if at >= 0:  # it waits for the fingerprint in the usage chunk
                    start = _event_start(block, at)
                    if len(block) - start <= MAX_HELD_BYTES:
                        block, self._held = block[:start], block[start:]
                    else:  # too much to hold: it goes on as it came, unstamped, and so does the rest
                        self._holds = False
        self.tokens += self._tokens(block)
        return block

    def end(self) -> bytes:
        """The pod ended the stream: whatever is still held goes out as it came."""
        held, out = self._held, self._buf
        if not held:  # most streams end with nothing held: no count to make, nothing to join
            if out:
                self._buf = b""
            return out
        self.tokens += self._tokens(held)
        self._held, self._buf = b"", b""
        return held + out

    def _tokens(self, events: bytes) -> int:
        """Tokens in whole chunks (none of them the usage chunk): one a chunk (vLLM's hold one
        choice each) unless the read is larger than that would take (merged chunks: measured),
        less chat's opening chunks (a ``delta`` that opens with ``role``)."""
        n = events.count(b'"choices"')
        if n == 0:
            return 0
        size, plain = len(events), self._plain
        if plain == 0 or size > n * plain + MERGED_SLACK:
            tokens = _measured(events)
        else:
            tokens = n
        self._plain = min(plain, size / n) if plain else size / n
        return max(0, tokens - events.count(_OPENING)) if self.chat else tokens

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


def _measured(events: bytes) -> int:
    """Tokens in whole chunks, a chunk max(1, its text's bytes // MERGED_BYTES_PER_TOKEN)
    (a chat opening chunk counts 1 here, taken off by the caller)."""
    tokens = 0
    for event in events.split(b"\n\n"):
        if b'"choices"' not in event:
            continue
        size = 0
        for text in _TEXT.findall(event):
            size += len(text) - 5 * text.count(b"\\u")  # \u00e9: one, not six
        tokens += max(1, size // MERGED_BYTES_PER_TOKEN)
    return tokens


def _spelling(block: bytes) -> tuple[bytes, bytes, bytes]:
    """The keys as the pod spells them, from its first chunk's choices key (COMPACT if none)."""
    i = block.find(b'"choices":')  # the first chunk's, near its start
    return SPACED if i >= 0 and block[i + 10] == 32 else COMPACT  # 32: b" " (a byte is an int)


def _event_start(block: bytes, at: int) -> int:
    """Where the event holding position ``at`` of ``block`` begins."""
    i = block.rfind(b"\n\n", 0, at)
    return i + 2 if i >= 0 else 0


def _stamped(events: bytes, stamp: bytes, finished: bytes) -> bytes:
    """``events`` with the usage chunk's ``system_fingerprint`` (``stamp``: its bytes as sent,
    comma first) put back on each terminal chunk, as vLLM sends them without include_usage."""
    out = []
    end = len(events)
    at = events.rfind(finished)  # from the end: the terminal chunks are the last ones
    while at >= 0:
        close = events.rindex(b"}", 0, events.index(b"\n\n", at))
        out += [events[close:end], stamp]
        end = _event_start(events, at)  # the chunk before this one: one stamp a chunk
        out.append(events[end:close])
        at = events.rfind(finished, 0, end)
    out.append(events[:end])
    return b"".join(reversed(out))


def usage_counts(data: bytes, start: int = 0, stop: int | None = None) -> tuple[int, int] | None:
    """(prompt, completion) tokens of the usage object in ``data[start:stop]``, when it reports
    them (a usage chunk, or the bytes from an answer's usage key on)."""
    end = len(data) if stop is None else stop
    p, c = _PROMPT.search(data, start, end), _COMPLETION.search(data, start, end)
    return (int(p.group(1)), int(c.group(1))) if p is not None and c is not None else None
