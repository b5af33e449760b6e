"""Per-tenant rate limiting in model units: GCRA (pure) and the in-process limiter.

A reservation of R MU/min is a GCRA (generic cell rate algorithm, the leaky bucket as a meter)
keyed by endpoint: each MU advances a "theoretical arrival time" (TAT) by 60/R seconds; a
request conforms while TAT - now stays within the burst tolerance tau = burst_s seconds of the
rate. Worked numbers: R = 600 MU/min -> 0.1 s per MU; burst_s 10 -> tau 10 s = 100 MU of burst.
From an empty bucket at t=0, twenty 5-MU requests conform (TAT 10.0); the 21st would take TAT to
10.5 > 0 + 10 -> not conforming, Retry-After 0.5 s. A request larger than the whole burst still
conforms when the bucket is empty (else it could never run), and pushes TAT forward.

Estimates are corrected exactly after a response: the difference (exact - estimate, often
negative because output is priced at max_tokens) is carried per key in memory and applied to the
key's TAT at its next check, before that request is judged, so the exact price is charged with no
round trip and a request is judged against the bucket the exact prices left.

Classes of traffic (``classify``): probes are always admitted; reserved traffic is what conforms
to the reservation; traffic beyond it is best-effort, admitted only if the reservation allows
best effort and the endpoint has headroom; otherwise 429 with Retry-After. An endpoint without a
reservation has no GCRA to check: all of its traffic is best-effort.

Limiters keep the GCRA state. ``InProcessLimiter``: one router alone (R enforced per process).
Routers sharing a Redis URL use ``lease_limiter.LeasedLimiter``: each admits locally, in
process, at the rate of a share of R it leases from Redis in the background (``lease``), so
that R holds across all of them and no request waits on Redis.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol


@dataclass(frozen=True)
class GcraLimit:
    mu_per_minute: float  # sustained rate, MU/min, > 0
    burst_s: float  # burst tolerance as seconds of the rate, s (10 s at 600 MU/min = 100 MU)

    @property
    def interval_s(self) -> float:
        """Seconds per MU: 600 MU/min -> 0.1 s."""
        return 60.0 / self.mu_per_minute


@dataclass(frozen=True)
class GcraDecision:
    allowed: bool  # the request conforms to the limit
    retry_after_s: float  # when it would conform, s from now (0 when allowed)
    tat: float  # the new theoretical arrival time (unchanged when denied), s


def gcra(
    tat: float, now: float, cost_mu: float, limit: GcraLimit, correction_mu: float = 0.0
) -> GcraDecision:
    """One GCRA step. tat=0, now=0, 5 MU at 600 MU/min, burst 10 s -> allowed, tat 0.5.

    ``correction_mu`` (exact - estimated MU of requests already admitted) moves the TAT before
    this request is judged, so a request is judged against the bucket as the exact prices left it:
    at 100 MU/min, a 60-MU estimate admitted at 0 (TAT 36 s) that cost 0.12 MU leaves TAT 0.07 s,
    and a second 60-MU request at 0.3 s finds the bucket empty and runs (folded into its cost
    instead, the TAT of 36 s would refuse it for 26 s)."""
    corrected = tat + correction_mu * limit.interval_s
    base = corrected if corrected > now else now  # a refund empties the bucket, no further
    new_tat = base + cost_mu * limit.interval_s
    if new_tat < now:
        new_tat = now  # a negative cost cannot bank credit beyond an empty bucket
    if base > now and new_tat - now > limit.burst_s:
        return GcraDecision(False, new_tat - now - limit.burst_s, tat)
    return GcraDecision(True, 0.0, new_tat)


class TrafficClass(Enum):
    PROBE = "probe"  # health probe: never shed
    RESERVED = "reserved"  # within the tenant's reservation
    BEST_EFFORT = "best_effort"  # beyond it, while the endpoint has headroom
    REJECTED = "rejected"  # 429


def classify(
    is_probe: bool, has_reservation: bool, conforms: bool, best_effort_allowed: bool, headroom: bool
) -> TrafficClass:
    """Admission class; the table in the module docstring, as code."""
    if is_probe:
        return TrafficClass.PROBE
    if has_reservation and conforms:
        return TrafficClass.RESERVED
    if best_effort_allowed and headroom:
        return TrafficClass.BEST_EFFORT
    return TrafficClass.REJECTED


def has_headroom(mu_rate_per_min: float, cost_mu: float, capacity_mu_per_min: float) -> bool:
    """Best effort fits: recent MU rate (+ this request) below capacity. 700+5 < 800 -> True."""
    return mu_rate_per_min + cost_mu < capacity_mu_per_min


class Limiter(Protocol):
    reports_admitted: bool  # other routers read what this one admits (``admitted``; called only then)

    async def check(self, key: str, cost_mu: float, limit: GcraLimit) -> GcraDecision:
        """The reserved-traffic decision for ``cost_mu`` MU on ``key`` (an endpoint)."""
        ...

    def correct(self, key: str, delta_mu: float) -> None:
        """Exact minus estimated MU of a finished request, charged on the key's next check."""
        ...

    def admitted(self, key: str, cost_mu: float) -> None:
        """A request of ``key`` was admitted (any class), for the shared headroom figures."""
        ...

    def others_mu_per_min(self, key: str) -> float:
        """MU/min that other routers admit on ``key`` (0 when none share it)."""
        ...

    async def run(self) -> None:
        """Background work for as long as the router runs (none in process)."""
        ...

    def metrics_text(self) -> str:
        """The limiter's own metrics, Prometheus text ("" when it has none)."""
        ...


class InProcessLimiter:
    """GCRA state in a dict: one router process alone (static mode without ``--redis``)."""

    reports_admitted = False  # alone: nobody reads what it admitted (no call a request)

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._tat: dict[str, float] = {}
        self._pending: dict[str, float] = {}  # exact - estimated MU, charged on the next check

    def check_now(self, key: str, cost_mu: float, limit: GcraLimit) -> GcraDecision:
        correction = self._pending.pop(key, 0.0)
        d = gcra(self._tat.get(key, 0.0), self._clock(), cost_mu, limit, correction)
        if d.allowed:
            self._tat[key] = d.tat
        elif correction:
            self._pending[key] = correction  # not charged yet: keep it for the next check
        return d

    async def check(self, key: str, cost_mu: float, limit: GcraLimit) -> GcraDecision:
        return self.check_now(key, cost_mu, limit)

    def correct(self, key: str, delta_mu: float) -> None:
        self._pending[key] = self._pending.get(key, 0.0) + delta_mu

    def admitted(self, key: str, cost_mu: float) -> None:
        pass  # the endpoint's local rate window is all there is

    def others_mu_per_min(self, key: str) -> float:
        return 0.0

    async def run(self) -> None:
        pass

    def metrics_text(self) -> str:
        return ""


def retry_after_header(seconds: float) -> str:
    """Retry-After is whole seconds, rounded up, at least 1: 0.5 s -> "1", 2.1 s -> "3"."""
    return str(max(1, math.ceil(seconds)))
