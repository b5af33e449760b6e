"""Per-tenant rate limiting in model units: GCRA (pure), in-process and Redis backends.

A reservation of R MU/min is a GCRA (generic cell rate algorithm, the leaky bucket as a meter)
keyed by endpoint: each MU advances a "theoretical arrival time" (TAT) by 60/R seconds; a
request conforms while TAT - now stays within the burst tolerance tau = burst_s seconds of the
rate. Worked numbers: R = 600 MU/min -> 0.1 s per MU; burst_s 10 -> tau 10 s = 100 MU of burst.
From an empty bucket at t=0, twenty 5-MU requests conform (TAT 10.0); the 21st would take TAT to
10.5 > 0 + 10 -> not conforming, Retry-After 0.5 s. A request larger than the whole burst still
conforms when the bucket is empty (else it could never run), and pushes TAT forward.

Estimates are corrected exactly after a response: the difference (exact - estimate, often
negative because output is priced at max_tokens) is carried per key in memory and added to the
key's next check, so the exact price is charged with no extra Redis round trip.

Classes of traffic (``classify``): probes are always admitted; reserved traffic is what conforms
to the reservation; traffic beyond it is best-effort, admitted only if the reservation allows
best effort and the endpoint has headroom; otherwise 429 with Retry-After. An endpoint without a
reservation has no GCRA to check (no Redis round trip): all of its traffic is best-effort.

The Redis backend runs one Lua script (atomic, one round trip; the clock is Redis TIME so that
all router replicas share it). Key layout: ``mu:gcra:{key}`` -> TAT as a decimal string, seconds
since the epoch, with a TTL of (TAT - now) + 1 s so that idle tenants leave nothing behind.
If Redis is unreachable the router falls back to the in-process limiter (fail open, per replica).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from redis.exceptions import RedisError


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


def gcra(tat: float, now: float, cost_mu: float, limit: GcraLimit) -> GcraDecision:
    """One GCRA step. tat=0, now=0, 5 MU at 600 MU/min, burst 10 s -> allowed, tat 0.5."""
    base = tat if tat > now else now
    new_tat = base + cost_mu * limit.interval_s
    if new_tat < now:
        new_tat = now  # a negative correction cannot bank credit beyond an empty bucket
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
    async def check(self, key: str, cost_mu: float, limit: GcraLimit) -> GcraDecision: ...

    def correct(self, key: str, delta_mu: float) -> None: ...


class _Corrections:
    def __init__(self) -> None:
        self._pending: dict[str, float] = {}

    def correct(self, key: str, delta_mu: float) -> None:
        """Exact minus estimated MU of a finished request, charged on the key's next check."""
        self._pending[key] = self._pending.get(key, 0.0) + delta_mu

    def _take(self, key: str) -> float:
        return self._pending.pop(key, 0.0)


class InProcessLimiter(_Corrections):
    """GCRA state in a dict, for the embedded single-router mode and as Redis's fallback."""

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__()
        self._clock = clock
        self._tat: dict[str, float] = {}

    def check_now(self, key: str, cost_mu: float, limit: GcraLimit) -> GcraDecision:
        correction = self._take(key)
        d = gcra(self._tat.get(key, 0.0), self._clock(), cost_mu + correction, limit)
        if d.allowed:
            self._tat[key] = d.tat
        elif correction:
            self._pending[key] = correction  # not charged yet: keep it for the next check
        return d

    async def check(self, key: str, cost_mu: float, limit: GcraLimit) -> GcraDecision:
        return self.check_now(key, cost_mu, limit)


# KEYS[1] gcra key; ARGV: cost MU, seconds per MU, burst s, [now s for tests, else Redis TIME].
# Returns {allowed 0/1, retry_after string, tat string} (Lua numbers would be truncated to ints).
GCRA_LUA = """
local now
if ARGV[4] and ARGV[4] ~= '' then now = tonumber(ARGV[4]) else
  local t = redis.call('TIME'); now = tonumber(t[1]) + tonumber(t[2]) / 1000000 end
local cost, interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local base = tat
if base < now then base = now end
local new_tat = base + cost * interval
if new_tat < now then new_tat = now end
if base > now and new_tat - now > burst then
  return {0, string.format('%.6f', new_tat - now - burst), string.format('%.6f', tat)}
end
redis.call('SET', KEYS[1], string.format('%.6f', new_tat), 'PX', math.floor((new_tat - now) * 1000) + 1000)
return {1, '0', string.format('%.6f', new_tat)}
"""


class RedisLimiter(_Corrections):
    """GCRA in Redis, shared by every router replica; one EVALSHA per checked request."""

    def __init__(
        self,
        redis: Any,
        prefix: str = "mu:gcra:",
        fallback: InProcessLimiter | None = None,
        now_for_tests: Callable[[], float] | None = None,
    ) -> None:
        super().__init__()
        self._redis = redis
        self._prefix = prefix
        self._script = redis.register_script(GCRA_LUA)
        self._fallback = fallback
        self._now = now_for_tests
        self.errors = 0  # Redis failures answered by the fallback, count

    async def check(self, key: str, cost_mu: float, limit: GcraLimit) -> GcraDecision:
        correction = self._take(key)
        now = "" if self._now is None else repr(self._now())
        try:
            allowed, retry, tat = await self._script(
                keys=[self._prefix + key],
                args=[repr(cost_mu + correction), repr(limit.interval_s), repr(limit.burst_s), now],
            )
        except (RedisError, OSError):
            self.errors += 1
            if self._fallback is None:
                raise
            return self._fallback.check_now(key, cost_mu + correction, limit)
        if not int(allowed) and correction:
            self._pending[key] = self._pending.get(key, 0.0) + correction
        return GcraDecision(bool(int(allowed)), float(retry), float(tat))


def retry_after_header(seconds: float) -> str:
    """Retry-After is whole seconds, rounded up, at least 1: 0.5 s -> "1", 2.1 s -> "3"."""
    return str(max(1, math.ceil(seconds)))
