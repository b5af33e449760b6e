"""The kinds of query parameter the API and the console read, each checked in one place. Pure: no I/O.

An id is what a primary-key or foreign-key column can hold (PostgreSQL ``bigint``: at most
2**63 - 1, which SQLite's INTEGER holds too); a larger one could only be a mistake or a probe, and
the databases answer it differently (PostgreSQL compares it as numeric, SQLite's driver overflows),
so it is refused before any query. A date-time is ISO 8601, UTC when it has no offset, and must
stay a date-time once converted to UTC (``0001-01-01T00:00:00+14:00`` is a day before year 1). A
cursor holds an id too. A boolean is true or false (a misspelt one is not read as "any"). Each
failure is a ``ParameterError`` naming the parameter; the API turns it into a 400
`{"error": "invalid", "fields": {name: ...}}`, the console into a 400 naming it.
"""

from datetime import UTC, datetime

from django.utils.dateparse import parse_datetime

MAX_ID = 2**63 - 1  # bigint, the ids' column type
MAX_DIGITS = len(str(MAX_ID))  # a longer string is no id (and int() of 4,300+ digits raises)


class ParameterError(ValueError):
    """A query parameter that is not what its kind allows; ``name`` is the parameter."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


def integer(name: str, raw: str, lowest: int = 0, highest: int = MAX_ID) -> int:
    """A whole number written in ASCII digits (an optional leading minus), lowest..highest."""
    digits = raw[1:] if raw.startswith("-") else raw
    if not (digits.isascii() and digits.isdigit()) or len(digits) > MAX_DIGITS:
        raise ParameterError(name, f"must be a whole number from {lowest} to {highest}, got {raw[:40]!r}")
    value = int(raw)
    if not lowest <= value <= highest:
        raise ParameterError(name, f"must be a whole number from {lowest} to {highest}, got {raw[:40]!r}")
    return value


def object_id(name: str, raw: str) -> int:
    """An object's id: 1 to the largest bigint."""
    return integer(name, raw, lowest=1)


TRUE = frozenset({"true", "1", "yes"})
FALSE = frozenset({"false", "0", "no"})


def boolean(name: str, raw: str) -> bool:
    """true/false (also 1/0 and yes/no, any case): anything else is refused, not read as "any"."""
    if raw.lower() in TRUE:
        return True
    if raw.lower() in FALSE:
        return False
    raise ParameterError(name, f"must be true or false, got {raw[:40]!r}")


def utc_datetime(name: str, raw: str) -> datetime:
    """An ISO 8601 date-time as an aware UTC datetime (no offset: UTC)."""
    try:
        parsed = parse_datetime(raw.strip())
    except ValueError:  # well-formed but impossible (a 13th month, a 25th hour)
        parsed = None
    if parsed is None:
        raise ParameterError(name, f"must be an ISO 8601 date-time, got {raw[:40]!r}")
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ParameterError(name, f"is out of range once converted to UTC: {raw[:40]!r}") from None
