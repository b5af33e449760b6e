"""What a load run measured, as pure functions of the times the client saw: no clock, no I/O.

A request's times are monotonic seconds: when it was sent, when each content chunk of its
stream arrived, when its body ended. From them (worked numbers: sent at 10.0, content chunks at
10.20, 10.25 and 10.35, body ended at 10.40):

    end to end   ended - sent                                  0.40 s
    TTFT         first content chunk - sent                    0.20 s
    ITL          gaps between consecutive content chunks       [0.05, 0.10] s

A content chunk is an SSE chunk whose choice carries text. The usage chunk (``choices: []``)
and an empty text (vLLM sends one while it holds text back for a stop string) are not content,
so they neither start TTFT nor split an ITL gap. Only successful requests enter the latency
samples and the throughput, as in vLLM's ``benchmarks/serve.py``; failures are counted by what
failed. Percentiles are nearest-rank: p50 of [1, 2, 3, 4] is 2, p99 of 100 samples is the 99th.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

NO_DONE = "no [DONE]"  # a stream that ended without its terminating event
CONNECT_BACK_OFF_S = 0.5  # the server is away: a closed-loop client waits this long, not spinning
MAX_BACK_OFF_S = 60.0  # the longest Retry-After a closed-loop client honours, s
BAD_JSON = "bad json"  # an answer or an SSE data line that is not a JSON object


@dataclass(frozen=True)
class Outcome:
    """One finished request, as the client saw it."""

    error: str | None  # None when it succeeded; else an HTTP status ("429"), an exception name
    # ("ReadTimeout"), "stream 500" (an error event inside the stream), NO_DONE or BAD_JSON
    started_s: float  # when it was sent, monotonic s
    ended_s: float  # when its body ended (or it failed), monotonic s, >= started_s
    chunk_times_s: tuple[float, ...] = ()  # each content chunk's arrival, monotonic s, ascending
    output_tokens: int = 0  # the engine's usage.completion_tokens, else the content chunks counted
    # How long a closed-loop client waits before its next request, s: a 429's or 503's Retry-After
    # (1 s without one), CONNECT_BACK_OFF_S when no connection could be made, else 0.
    back_off_s: float = 0.0


def time_to_first_token(outcome: Outcome) -> float | None:
    """First content chunk - sent, s; None for an answer that was not streamed or carried none."""
    return outcome.chunk_times_s[0] - outcome.started_s if outcome.chunk_times_s else None


def inter_token_latencies(outcome: Outcome) -> list[float]:
    """The gaps between consecutive content chunks, s: n chunks -> n - 1 gaps."""
    return [later - earlier for earlier, later in itertools.pairwise(outcome.chunk_times_s)]


def percentile(samples: Sequence[float], q: float) -> float | None:
    """The nearest-rank q-quantile (0 < q <= 1) of the samples; None when there are none."""
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def refused(status: int, retry_after: str | None, started_s: float, ended_s: float) -> Outcome:
    """A non-200 answer. A 429 or 503 asks the client to wait Retry-After seconds (1 s when the
    header is absent or a date: the router sends seconds; at most MAX_BACK_OFF_S); others do not."""
    back_off_s = 0.0
    if status in (429, 503):
        try:
            back_off_s = min(MAX_BACK_OFF_S, max(0.0, float(retry_after or "1")))
        except ValueError:
            back_off_s = 1.0
    return Outcome(str(status), started_s, ended_s, back_off_s=back_off_s)


def answered(raw: bytes, started_s: float, ended_s: float) -> Outcome:
    """A 200 answer that was not streamed: its tokens are its usage's completion_tokens."""
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return Outcome(BAD_JSON, started_s, ended_s)
    usage = answer.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return Outcome(None, started_s, ended_s, output_tokens=tokens if isinstance(tokens, int) else 0)


@dataclass
class StreamReading:
    """An SSE answer read so far: fed each line with the time it arrived."""

    chunk_times_s: list[float] = field(default_factory=list)
    usage_tokens: int | None = None  # the latest usage.completion_tokens seen
    done: bool = False  # saw ``data: [DONE]``
    error: str | None = None  # the first error event or unreadable chunk

    def feed(self, now_s: float, line: str) -> None:
        """One line of the body. Blank lines, comments (``: ping``) and other fields are not data."""
        if not line.startswith("data:") or self.error is not None:
            return
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            self.error = BAD_JSON
            return
        if not isinstance(chunk, dict):
            self.error = BAD_JSON
        elif (code := _error_code(chunk)) is not None:
            self.error = f"stream {code}"
        else:
            if _carries_text(chunk):
                self.chunk_times_s.append(now_s)
            usage = chunk.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                self.usage_tokens = usage["completion_tokens"]

    def outcome(self, started_s: float, ended_s: float) -> Outcome:
        """The request, once its body has ended."""
        error = self.error or (None if self.done else NO_DONE)
        tokens = self.usage_tokens if self.usage_tokens is not None else len(self.chunk_times_s)
        return Outcome(error, started_s, ended_s, tuple(self.chunk_times_s), tokens)


def _error_code(chunk: dict[str, Any]) -> str | None:
    """The code of an error event: vLLM 0.32 sends ``{"error": {..., "code": 500}}`` mid-stream
    (vllm/entrypoints/generate/base/serving.py, create_streaming_error_response); older releases
    sent a flat ``{"object": "error", ..., "code": 500}``. None for an ordinary chunk."""
    if isinstance(chunk.get("error"), dict):
        return str(chunk["error"].get("code", "error"))
    if chunk.get("object") == "error":
        return str(chunk.get("code", "error"))
    return None


def _carries_text(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices")
    return isinstance(choices, list) and any(isinstance(c, dict) and c.get("text") for c in choices)


@dataclass
class Tally:
    """Requests sent and finished over a period (5 s, or the whole run)."""

    sent: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # failed requests by what failed
    e2e_s: list[float] = field(default_factory=list)  # successful requests only, s
    ttft_s: list[float] = field(default_factory=list)  # successful streamed requests only, s
    itl_s: list[float] = field(default_factory=list)  # every gap of every successful stream, s
    output_tokens: int = 0  # of successful requests

    def record(self, outcome: Outcome) -> None:
        if outcome.error is not None:
            self.errors[outcome.error] += 1
            return
        self.ok += 1
        self.e2e_s.append(outcome.ended_s - outcome.started_s)
        if (ttft := time_to_first_token(outcome)) is not None:
            self.ttft_s.append(ttft)
        self.itl_s += inter_token_latencies(outcome)
        self.output_tokens += outcome.output_tokens

    def add(self, other: Tally) -> None:
        self.sent += other.sent
        self.ok += other.ok
        self.errors.update(other.errors)
        self.e2e_s += other.e2e_s
        self.ttft_s += other.ttft_s
        self.itl_s += other.itl_s
        self.output_tokens += other.output_tokens

    def line(self, label: str, period_s: float) -> str:
        """One report line; throughput is per second of the period. E.g. (wrapped here):
        `    10s clients  24  sent   120  ok   118  errors 429:2  req/s  23.6  tok/s  3021
        e2e p50 0.95s p99 1.40s  ttft p50 21.0ms p99 80.2ms  itl p50 7.1ms p99 9.9ms`"""
        errors = " ".join(f"{what}:{n}" for what, n in sorted(self.errors.items())) or "-"
        per_s = 1.0 / period_s if period_s > 0 else 0.0
        return (
            f"{label}  sent {self.sent:5d}  ok {self.ok:5d}  errors {errors}"
            f"  req/s {self.ok * per_s:5.1f}  tok/s {self.output_tokens * per_s:5.0f}"
            f"  e2e {_percentiles(self.e2e_s, 1.0, 's', 2)}"
            f"  ttft {_percentiles(self.ttft_s, 1000.0, 'ms', 2)}"
            f"  itl {_percentiles(self.itl_s, 1000.0, 'ms', 2)}"
        )


def _percentiles(samples: Sequence[float], scale: float, unit: str, digits: int) -> str:
    p50, p99 = percentile(samples, 0.50), percentile(samples, 0.99)
    if p50 is None or p99 is None:
        return "-"
    return f"p50 {p50 * scale:.{digits}f}{unit} p99 {p99 * scale:.{digits}f}{unit}"
