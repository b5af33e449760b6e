"""A request trace to replay, in the Azure LLM inference trace format, and its open-loop schedule.

The CSV has a header and one row per request (Azure Public Dataset, "Azure LLM inference trace
2023"; other files of that format may come from elsewhere):

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44

Each request is sent at (its timestamp - the first one's) / the rate multiple: at 2x, a request
6 s into the trace goes 3 s into the run. Its prompt is sized so that the router's estimate
(``capacity.units.estimate_tokens``: 4 bytes a token) reads ContextTokens, and its
``max_tokens`` is GeneratedTokens. Pure: the caller opens the file.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from capacity.units import BYTES_PER_TOKEN

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
FILLER = "hello "  # the prompt's text: ASCII, one byte a character


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the file, the line and the value."""


@dataclass(frozen=True)
class TraceRequest:
    at_s: float  # seconds after the trace's first request, in trace time (before the multiple), >= 0
    context_tokens: int  # prompt size, tokens, >= 1
    generated_tokens: int  # max_tokens of the request, >= 1


def read_trace(lines: Iterable[str], source: str) -> list[TraceRequest]:
    """The trace's requests in time order; raises TraceError on a bad header or row."""
    rows = csv.reader(lines)
    header = next(rows, None)
    if header is None or tuple(h.strip() for h in header) != COLUMNS:
        raise TraceError(f"{source}: line 1 must be the header {','.join(COLUMNS)}, got {header!r}")
    stamped: list[tuple[datetime, int, int]] = []
    for number, row in enumerate(rows, start=2):
        if not row:
            continue  # a blank line, e.g. at the end of the file
        if len(row) != len(COLUMNS):
            raise TraceError(f"{source}: line {number} has {len(row)} fields, expected {len(COLUMNS)}")
        when, context, generated = (field.strip() for field in row)
        try:
            stamp = datetime.fromisoformat(when)
        except ValueError:
            raise TraceError(f"{source}: line {number}: TIMESTAMP {when!r} is not a date and time") from None
        stamped.append(
            (
                stamp,
                _tokens(context, "ContextTokens", source, number),
                _tokens(generated, "GeneratedTokens", source, number),
            )
        )
    if not stamped:
        raise TraceError(f"{source}: no requests after the header")
    stamped.sort(key=lambda row: row[0])
    first = stamped[0][0]
    # An engine refuses an empty prompt and max_tokens 0: such rows are sent at 1 token.
    return [
        TraceRequest((stamp - first).total_seconds(), max(1, context), max(1, generated))
        for stamp, context, generated in stamped
    ]


def _tokens(text: str, column: str, source: str, number: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise TraceError(f"{source}: line {number}: {column} {text!r} is not a whole number >= 0")
    return value


def schedule(
    trace: list[TraceRequest], rate_multiple: float, duration_s: float | None
) -> list[tuple[float, TraceRequest]]:
    """(send offset in run seconds, request) for the requests due within the duration: a trace of
    requests at 0, 4 and 10 s at 2x within 5 s -> [(0.0, ...), (2.0, ...)]."""
    if rate_multiple <= 0:
        raise ValueError(f"rate multiple must be > 0, got {rate_multiple}")
    due = [(request.at_s / rate_multiple, request) for request in trace]
    return [(at, request) for at, request in due if duration_s is None or at < duration_s]


def prompt_of(context_tokens: int) -> str:
    """A prompt the router estimates at context_tokens: 100 tokens -> 400 ASCII characters."""
    size = context_tokens * BYTES_PER_TOKEN
    return (FILLER * (size // len(FILLER) + 1))[:size]
