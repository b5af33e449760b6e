"""The routers' per-second load samples: what each router measured of each endpoint in a second.

Writer: ``dataplane.router.metering``, through ``dataplane.router.delivery``. Readers:
``controlplane.endpoints.samples`` (the autoscaler's buckets, billing) and the
``/api/v1/load-samples/`` view. (router, second) is a ``RouterSecond``'s idempotency key: a router
sends its seconds oldest first, and a sink keeps one mark per router. With Redis the samples are
summed into the fixed-point ``SLOTS`` of ``mu:sec:{endpoint_id}:{unix_second}``; without, POSTed:

    {"router": "host-4711-9f2c01ab", "second": 1700000000,
     "rows": [{"endpoint": 7, "tenant": "acme", "requests": 3, ...}]}

Keys, TTLs and costs: docs/router.md, "Load samples".
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# After a pause the control plane builds the buckets of at most the last CATCH_UP_S of seconds
# (the autoscaler's horizon), and the rows outlive that by a minute: a collector (Celery beat)
# stopped for up to CATCH_UP_S misses no bucket. (Billing reads the billing stream, or the posted
# rows not billed yet, and waits for the collector however long it is stopped.)
CATCH_UP_S = 360
ROW_TTL_S = CATCH_UP_S + 60
# A router's mark in Redis (the last second the script accepted from it) is kept this long after
# that second: a router that re-sends a second it had delivered (its answer lost) within a week of
# it is not applied again; a router's ids are per process, so marks of routers long gone are
# dropped. Billing does not rest on it: the collector's marks in the database (RouterMark, kept as
# long as usage) bill a second the stream holds again once.
ACKED_TTL_S = 7 * 86400
BILLING_STREAM = "mu:billing"
# The billing stream's bound, entries: past it a router's billable second is not applied (the
# script answers "full"), and the router holds it (memory, spool) until the collector has billed
# some, so a collector stopped for hours never fills Redis (at maxmemory every write is refused:
# the Celery broker's that would start the collector again, the limiter's). One collector pass
# bills this many (collector.MAX_BILL_BATCHES x samples.BILL_BATCH); an entry of 10 endpoints'
# samples is about 3 KB of Redis: 300 MB at the bound.
BILLING_STREAM_MAX_ENTRIES = 100_000
# Upper bounds of the latency histogram's buckets, s: field lat{i} counts the requests whose
# latency fell in (LATENCY_BUCKETS_S[i-1], LATENCY_BUCKETS_S[i]], lat{len} those above them all.
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
NO_LATENCIES = (0,) * (len(LATENCY_BUCKETS_S) + 1)

# The slots of an endpoint's second in Redis, in order: slot i is the int64 at byte 8 i. Counts are
# stored as they are, amounts (the float fields) in millionths: 4.5 MU is 4_500_000. MAX_AMOUNT is
# 1e18 millionths, so ten routers' maximal samples would pass int64's 9.2e18: BITFIELD saturates
# there (OVERFLOW SAT) instead of wrapping.
SLOTS = (
    "requests", "inflight", "mu", "tokens_in", "tokens_out", "latency_ms_sum", "errors", "throttled",
    *(f"lat{i}" for i in range(len(NO_LATENCIES))), "queued", "queued_mu", "mu_squared", "squared_requests",
)  # fmt: skip
AMOUNT_SLOTS = frozenset({"inflight", "mu", "latency_ms_sum", "queued_mu", "mu_squared"})
FIXED_POINT = 1_000_000  # units per amount in a slot


def slot_increments(fields: Mapping[str, float]) -> list[tuple[int, int]]:
    """(slot, integer increment) for the fields that are not zero, as BITFIELD INCRBY takes them:
    {"requests": 3, "mu": 4.5} -> [(0, 3), (2, 4_500_000)]."""
    out = []
    for slot, name in enumerate(SLOTS):
        value = fields.get(name, 0)
        if value:
            out.append((slot, round(value * FIXED_POINT) if name in AMOUNT_SLOTS else int(value)))
    return out


def add_fields(into: dict[str, float], fields: Mapping[str, float]) -> None:
    """Sum one sample's fields into a router's running sum for its endpoint's second."""
    for name, value in fields.items():
        if value:
            into[name] = into.get(name, 0) + value


# Bounds of what a router can send; past them a value is a broken or hostile sender, refused.
# Counts (requests, tokens, errors, latency buckets, queued requests) are integers in
# 0..MAX_COUNT: a billion tokens in one endpoint's second would be a million 1,000-token answers.
# Amounts (inflight, mu, mu_squared, latency_ms_sum, queued_mu) are finite numbers in 0..MAX_AMOUNT (a
# thousand times the largest count: MU and milliseconds summed over a second's requests).
# `second` is a unix second in 1..MAX_SECOND (2106); `endpoint` an id in 0..MAX_ENDPOINT_ID (the
# database's integer column); `tenant` a slug of at most MAX_TENANT_CHARS, without NUL.
MAX_COUNT = 10**9
MAX_AMOUNT = 1e12
MAX_SECOND = 2**32 - 1
MAX_ENDPOINT_ID = 2**31 - 1
MAX_TENANT_CHARS = 63
# A router's id: letters, digits, ".", "_", "-", at most 80 characters (``router_id`` makes them).
# A router's second may be at most this far ahead of the sink's clock: a second far in the future
# would move its router's mark (the idempotency key) past the seconds it has yet to send, which
# would then read as retries and go unbilled. An hour: routers' clocks are kept by NTP, and one
# that is off by more has its seconds refused, counted, rather than skipping its real ones.
MAX_AHEAD_S = 3600


def check_not_ahead(second: int, now: float) -> None:
    """SampleError naming `second` when it is more than MAX_AHEAD_S past `now` (the sink's clock)."""
    if second > now + MAX_AHEAD_S:
        raise SampleError(
            "second", f"{second} is {second - now:.0f} s ahead of this clock; at most {MAX_AHEAD_S} s"
        )


ROUTER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")


def load_key(endpoint_id: int | str, second: int | str) -> str:
    """The Redis string of one endpoint's second; "*" for either makes a SCAN pattern."""
    return f"mu:sec:{endpoint_id}:{second}"


def routers_key(second: int | str) -> str:
    """The Redis counter of the routers that reported a second; "*" makes a SCAN pattern."""
    return f"mu:routers:{second}"


def acked_key(router: str) -> str:
    """The Redis string holding the last second accepted from a router; "*" makes a SCAN pattern."""
    return f"mu:acked:{router}"


class SampleError(ValueError):
    """A router's second that breaks the contract. ``field`` is the top-level key to blame
    ("router", "second" or "rows"), which the API's 400 names; the message says what was wrong."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field = field


def _count(doc: Mapping[str, Any], key: str, where: str) -> int:
    v = doc.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_COUNT:
        raise SampleError("rows", f"{where}.{key} must be an integer in 0..{MAX_COUNT}, got {v!r}")
    return v


def _amount(doc: Mapping[str, Any], key: str, where: str) -> float:
    v = doc.get(key, 0.0)
    if (
        isinstance(v, bool)
        or not isinstance(v, int | float)
        or not (math.isfinite(v) and 0 <= v <= MAX_AMOUNT)
    ):
        raise SampleError("rows", f"{where}.{key} must be a number in 0..{MAX_AMOUNT:g}, got {v!r}")
    return v


def least_mu_squared(mu: float, requests: float) -> float:
    """The smallest sum of MU squared that `requests` requests of `mu` MU in all can have: all of
    one size, mu^2 / requests (Cauchy-Schwarz; it holds for sums of samples too, so for a
    second's routers and a bucket's seconds); MU without a request counted is read as one
    request's. Squares below it are a broken router's, and they would make lumpy work read
    steady; bounded as the router bounds its squares. It bounds the squares by the counts the
    router sends with them: a router that lies about both, or one that reports squares as if
    every request were one size, is not caught (routers hold an operator's key)."""
    return min(mu * mu / max(requests, 1), MAX_AMOUNT)


def _mu_squared(doc: Mapping[str, Any], requests: int, mu: float, where: str) -> float:
    """Zero (a router from before the squares), or between the least `requests` requests of `mu`
    MU can have and mu^2 (one request with all of it); a relative 1e-9 for the floats' sums
    (identical MU summed a million times strays 4e-11). Refused like any bad field: an honest
    router's rows always pass (tests/router/test_metering.py posts them)."""
    v = _amount(doc, "mu_squared", where)
    least, most = least_mu_squared(mu, requests), min(mu * mu, MAX_AMOUNT)
    if v and not least * (1 - 1e-9) <= v <= most * (1 + 1e-9):
        raise SampleError(
            "rows",
            f"{where}.mu_squared must be 0 or in {least:g}..{most:g} (the least and most squares of "
            f"{requests} requests of {mu:g} MU), got {v!r}",
        )
    return v


def _squared_requests(doc: Mapping[str, Any], requests: int, where: str) -> int:
    """0 (a router before the squares) or every request of the row: one router squares all."""
    v = _count(doc, "squared_requests", where)
    if v not in (0, requests):
        raise SampleError("rows", f"{where}.squared_requests must be 0 or requests ({requests}), got {v!r}")
    return v


@dataclass(frozen=True)
class TrafficSample:
    """One router's second of one endpoint and tenant: requests finished, refused, in flight."""

    endpoint: int  # control-plane endpoint id, >= 0 (0 in static mode)
    tenant: str  # tenant slug ("" in static mode)
    requests: int = 0  # requests finished in the second, count >= 0
    inflight: float = 0.0  # in-flight requests averaged over the second, >= 0 (4 for half: 2.0)
    mu: float = 0.0  # MU consumed (exact from the response's usage, else the estimate), >= 0
    # each request's MU squared, summed, >= 0: with mu, how lumpy the work is (the autoscaler's
    # calm history plans at a full replica only where it is not)
    mu_squared: float = 0.0
    # the requests whose squares mu_squared sums: all of them, or 0 from a router before the
    # squares. Summed over routers it tells a second whose squares are whole from one where an
    # old router's MU came without them.
    squared_requests: int = 0
    tokens_in: int = 0  # prompt tokens (usage, else the estimate), >= 0
    tokens_out: int = 0  # generated tokens (usage, else SSE events counted), >= 0
    latency_ms_sum: float = 0.0  # sum of request latencies, ms >= 0 (/ requests: the mean)
    errors: int = 0  # 5xx answers and upstream failures, count >= 0
    throttled: int = 0  # 429 answers, count >= 0
    latency_buckets: tuple[int, ...] = NO_LATENCIES  # requests per bucket, len(NO_LATENCIES)

    def fields(self) -> dict[str, float]:
        """The measured fields by their wire names; latency buckets only where not zero."""
        return {
            "requests": self.requests,
            "inflight": self.inflight,
            "mu": self.mu,
            "mu_squared": self.mu_squared,
            "squared_requests": self.squared_requests,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "latency_ms_sum": self.latency_ms_sum,
            "errors": self.errors,
            "throttled": self.throttled,
            **{f"lat{i}": n for i, n in enumerate(self.latency_buckets) if n},
        }

    def to_json(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "tenant": self.tenant, **self.fields()}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str = "sample") -> TrafficSample:
        """Missing fields are zeros; a bad one is refused, named with its value."""
        requests, mu = _count(doc, "requests", where), _amount(doc, "mu", where)
        return cls(
            endpoint=_endpoint(doc, where),
            tenant=_tenant(doc, where),
            requests=requests,
            inflight=_amount(doc, "inflight", where),
            mu=mu,
            mu_squared=_mu_squared(doc, requests, mu, where),
            squared_requests=_squared_requests(doc, requests, where),
            tokens_in=_count(doc, "tokens_in", where),
            tokens_out=_count(doc, "tokens_out", where),
            latency_ms_sum=_amount(doc, "latency_ms_sum", where),
            errors=_count(doc, "errors", where),
            throttled=_count(doc, "throttled", where),
            latency_buckets=tuple(_count(doc, f"lat{i}", where) for i in range(len(NO_LATENCIES))),
        )


@dataclass(frozen=True)
class QueueSample:
    """Requests one router holds for one endpoint at the end of a second, waiting for a pod (or
    a wake): the backlog the autoscaler sizes replicas to drain. It belongs to no tenant."""

    endpoint: int  # control-plane endpoint id
    queued: int  # requests waiting, count >= 0
    queued_mu: float  # their estimated MU, >= 0; > 0 whenever a router sends one

    def fields(self) -> dict[str, float]:
        return {"queued": self.queued, "queued_mu": self.queued_mu}

    def to_json(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "tenant": "", **self.fields()}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str = "sample") -> QueueSample:
        _tenant(doc, where)  # checked, not kept: always "" on the wire
        return cls(_endpoint(doc, where), _count(doc, "queued", where), _amount(doc, "queued_mu", where))


Sample = TrafficSample | QueueSample


def _endpoint(doc: Mapping[str, Any], where: str) -> int:
    v = doc.get("endpoint")
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_ENDPOINT_ID:
        raise SampleError("rows", f"{where}.endpoint must be an integer in 0..{MAX_ENDPOINT_ID}, got {v!r}")
    return v


def _tenant(doc: Mapping[str, Any], where: str) -> str:
    v = doc.get("tenant")
    if not isinstance(v, str) or len(v) > MAX_TENANT_CHARS or "\x00" in v:
        raise SampleError(
            "rows",
            f"{where}.tenant must be a string of at most {MAX_TENANT_CHARS} characters, no NUL, got {v!r}",
        )
    return v


def stored_fields(sample: Sample) -> dict[str, Any]:
    """A sample as the database keeps it: everything but the endpoint, which has its column."""
    row = sample.to_json()
    del row["endpoint"]
    return row


def sample_from_json(doc: Mapping[str, Any], where: str = "sample") -> Sample:
    """A row on the wire: a queue sample when it counts queued requests, else a traffic sample."""
    return (QueueSample if "queued" in doc else TrafficSample).from_json(doc, where)


def billed(samples: Iterable[Sample]) -> tuple[TrafficSample, ...]:
    """What of a second's samples usage keeps (controlplane.endpoints.usage.FIGURES), for the
    billing stream: the traffic samples that add to it (not queue samples, nor seconds of
    requests still in flight), without the autoscaler's figures (in flight, latencies, squares)."""
    return tuple(
        TrafficSample(
            s.endpoint,
            s.tenant,
            requests=s.requests,
            mu=s.mu,
            tokens_in=s.tokens_in,
            tokens_out=s.tokens_out,
            errors=s.errors,
            throttled=s.throttled,
        )
        for s in samples
        if isinstance(s, TrafficSample)
        and any((s.requests, s.mu, s.tokens_in, s.tokens_out, s.errors, s.throttled))
    )


@dataclass(frozen=True)
class RouterSecond:
    """What one router sends for one second: its samples, and by the sending itself that it was
    up (a second without traffic has no rows); ``router`` and ``second`` are its idempotency key."""

    second: int  # the unix second the samples describe, > 0; increasing per router
    samples: tuple[Sample, ...]
    router: str  # the sending router's id (ROUTER_ID), one per router process

    def to_json(self) -> dict[str, Any]:
        return {"router": self.router, "second": self.second, "rows": [s.to_json() for s in self.samples]}

    @classmethod
    def from_json(cls, doc: Any) -> RouterSecond:
        """Refuses what is wrong with a SampleError naming the field and the value."""
        if not isinstance(doc, Mapping):
            raise SampleError(None, f"a router's second must be a JSON object, got {doc!r}")
        router, second, rows = doc.get("router"), doc.get("second"), doc.get("rows")
        if not isinstance(router, str) or not ROUTER_ID.fullmatch(router):
            raise SampleError(
                "router",
                f"{router!r} must be a router id: 1 to 80 letters, digits, '.', '_' or '-', not starting"
                " with a punctuation mark",
            )
        if isinstance(second, bool) or not isinstance(second, int) or not 0 < second <= MAX_SECOND:
            raise SampleError("second", f"{second!r} must be a unix second (an integer in 1..{MAX_SECOND})")
        if not isinstance(rows, list) or not all(
            isinstance(r, dict) and isinstance(r.get("endpoint"), int) and r["endpoint"] > 0 for r in rows
        ):
            raise SampleError("rows", "must be a list of objects, each with a positive integer endpoint")
        return cls(second, tuple(sample_from_json(r, f"rows[{i}]") for i, r in enumerate(rows)), router)


@dataclass(frozen=True)
class EndpointSecond:
    """One endpoint's second as the autoscaler reads it: every router's and tenant's samples
    summed (Redis sums them as routers write; the database's rows are summed as they are read).
    All fields are sums over the samples, >= 0; see TrafficSample and QueueSample for units."""

    requests: float = 0.0
    inflight: float = 0.0
    mu: float = 0.0
    tokens_in: float = 0.0
    tokens_out: float = 0.0
    latency_ms_sum: float = 0.0
    errors: float = 0.0
    throttled: float = 0.0
    latency_buckets: tuple[float, ...] = tuple(map(float, NO_LATENCIES))
    queued: float = 0.0
    queued_mu: float = 0.0
    mu_squared: float = 0.0
    squared_requests: float = 0.0

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> EndpointSecond:
        """From the fields of one sample, or of a Redis hash: missing fields are zeros, others
        (the per-tenant MU, the tenant) are not this sum's."""

        def get(name: str) -> float:
            return float(fields.get(name, 0.0))

        return cls(
            requests=get("requests"),
            inflight=get("inflight"),
            mu=get("mu"),
            tokens_in=get("tokens_in"),
            tokens_out=get("tokens_out"),
            latency_ms_sum=get("latency_ms_sum"),
            errors=get("errors"),
            throttled=get("throttled"),
            latency_buckets=tuple(get(f"lat{i}") for i in range(len(NO_LATENCIES))),
            queued=get("queued"),
            queued_mu=get("queued_mu"),
            mu_squared=get("mu_squared"),
            squared_requests=get("squared_requests"),
        )

    @classmethod
    def from_redis_slots(cls, raw: bytes) -> EndpointSecond:
        """From the string of an endpoint's second (``SLOTS``); a short string's missing slots
        are zeros (BITFIELD grows it only as far as the highest slot incremented)."""
        n = min(len(raw) // 8, len(SLOTS))
        values = struct.unpack(f">{n}q", raw[: 8 * n])
        return cls.from_fields(
            {
                name: value / FIXED_POINT if name in AMOUNT_SLOTS else value
                for name, value in zip(SLOTS, values, strict=False)
            }
        )

    def __add__(self, other: EndpointSecond) -> EndpointSecond:
        return EndpointSecond(
            requests=self.requests + other.requests,
            inflight=self.inflight + other.inflight,
            mu=self.mu + other.mu,
            tokens_in=self.tokens_in + other.tokens_in,
            tokens_out=self.tokens_out + other.tokens_out,
            latency_ms_sum=self.latency_ms_sum + other.latency_ms_sum,
            errors=self.errors + other.errors,
            throttled=self.throttled + other.throttled,
            latency_buckets=tuple(
                a + b for a, b in zip(self.latency_buckets, other.latency_buckets, strict=True)
            ),
            queued=self.queued + other.queued,
            queued_mu=self.queued_mu + other.queued_mu,
            mu_squared=self.mu_squared + other.mu_squared,
            squared_requests=self.squared_requests + other.squared_requests,
        )
