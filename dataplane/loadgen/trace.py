"""A request trace to replay, in the Azure LLM inference trace format, and its open-loop schedule.

The CSV has a header and one row per request (Azure Public Dataset, "Azure LLM inference trace
2023"; other files of that format may come from elsewhere):

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44

Each request is sent at (its timestamp - the first one's) / the rate multiple: at 2x, a request
6 s into the trace goes 3 s into the run. Its prompt is sized so that the router's estimate
(``capacity.units.estimate_tokens``: 4 bytes a token) reads ContextTokens, and its
``max_tokens`` is GeneratedTokens. Pure: the caller opens the file (in binary: ``decoded`` reads
it as UTF-8, line by line, so that a byte that is not names its line).

A bad file is a ``TraceError`` naming the file, the line and the value, never a traceback: a
missing or extra column, bytes that are not UTF-8, a time that is not ISO 8601, times with a UTC
offset mixed with times without one (they cannot be ordered), a token count that is not a whole
number from 0 to ``MAX_TOKENS``.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from capacity.units import BYTES_PER_TOKEN

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
FILLER = "hello "  # the prompt's text: ASCII, one byte a character
# A request's tokens at most: 8 MiB of prompt at 4 bytes a token, the router's default body limit
# (a larger prompt could not be sent; a count of 10**20 would only run the generator out of memory).
MAX_TOKENS = 2**21


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the file, the line and the value."""


@dataclass(frozen=True)
class TraceRequest:
    at_s: float  # seconds after the trace's first request, in trace time (before the multiple), >= 0
    context_tokens: int  # prompt size, tokens, >= 1
    generated_tokens: int  # max_tokens of the request, >= 1


def decoded(raw_lines: Iterable[bytes], source: str) -> Iterator[str]:
    """A file's lines as text (UTF-8, a byte-order mark dropped); TraceError naming the line of
    a byte that is not UTF-8."""
    for number, raw in enumerate(raw_lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(
                f"{source}: line {number}: byte 0x{raw[exc.start]:02x} at column {exc.start + 1} is not UTF-8"
            ) from None
        yield text.removeprefix("\ufeff") if number == 1 else text


def read_trace(lines: Iterable[str], source: str) -> list[TraceRequest]:
    """The trace's requests in time order; raises TraceError on a bad header or row."""
    rows = _rows(lines, source)
    header = next(rows, None)
    if header is None or tuple(h.strip() for h in header) != COLUMNS:
        raise TraceError(f"{source}: line 1 must be the header {','.join(COLUMNS)}, got {header!r:.200}")
    stamped: list[tuple[datetime, int, int]] = []
    zoned: tuple[bool, int] | None = None  # whether the first row's time has an offset, and its line
    for number, row in enumerate(rows, start=2):
        if not row:
            continue  # a blank line, e.g. at the end of the file
        if len(row) != len(COLUMNS):
            raise TraceError(f"{source}: line {number} has {len(row)} fields, expected {len(COLUMNS)}")
        when, context, generated = (field.strip() for field in row)
        try:
            stamp = datetime.fromisoformat(when)
        except ValueError:
            raise TraceError(
                f"{source}: line {number}: TIMESTAMP {when[:60]!r} is not a date and time"
            ) from None
        has_offset = stamp.utcoffset() is not None
        if zoned is None:
            zoned = (has_offset, number)
        elif has_offset != zoned[0]:
            raise TraceError(
                f"{source}: line {number}: TIMESTAMP {when!r} has {'a' if has_offset else 'no'} UTC offset,"
                f" line {zoned[1]}'s {'has none' if has_offset else 'has one'}: a trace's times all have"
                " one or none"
            )
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


def _rows(lines: Iterable[str], source: str) -> Iterator[list[str]]:
    """The CSV's rows; a row csv cannot read (a field past its size limit) names its line."""
    reader = csv.reader(lines)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TraceError(f"{source}: line {reader.line_num}: {exc}") from None
        yield row


def _tokens(text: str, column: str, source: str, number: int) -> int:
    if text.isascii() and text.isdigit() and len(text) <= len(str(MAX_TOKENS)) and int(text) <= MAX_TOKENS:
        return int(text)
    raise TraceError(
        f"{source}: line {number}: {column} {text[:40]!r} is not a whole number from 0 to {MAX_TOKENS}"
    )


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
