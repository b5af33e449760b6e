"""The leased limiter: reservations shared by every router on one Redis, admitted locally.

Admission never waits on Redis: ``check`` runs the in-process GCRA at the rate of this holder's
lease (``lease`` has the arithmetic); a background task (``run``) renews every active
endpoint's lease when ``lease.renewal_due`` (each ``renew_s`` while contended or moving, else
each ``steady_renew_s``) with one EVALSHA of ``LEASE_LUA`` (TIME, GET, SET inside: 4 commands
per endpoint per renewal, whatever the request rate). The first request of an endpoint
admits at R / (holders seen recently: the most the store counted on any endpoint, or
``provisional_holders`` before its first answer) and wakes the renewer at once.

An idle endpoint (no request for ``idle_s``) returns its lease; its share is dropped only once
its GCRA owes nothing (TAT not in the future): a request priced at a minute of R leaves a
minute of debt, whether the tenant waits or not.

Faults: Redis away, a holder keeps admitting at its lease until the lease expires (``ttl_s``
after the renewal was sent, never later than the store's own expiry), then at R / (holders seen
recently); ``router_limiter_mode`` says which, ``router_lease_fallback_total`` counts the
entries into fallback, and one log line marks each entry and exit. A holder that dies leaves
its lease to expire in the store.

Key layout: ``{prefix}{endpoint key}`` -> JSON ``{"l": {holder: [demand, ask, granted, expires_at,
admitted]}, "s": {holder: last_renewal}}`` (MU/s; seconds of Redis TIME), with a TTL of
``seen_s`` so that an endpoint nobody serves leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from dataplane.router.lease import LeaseTerms, ask_for, ewma, fallback_rate, renewal_due, rescale_tat
from dataplane.router.ratelimit import GcraDecision, GcraLimit, gcra
from dataplane.wire.prometheus_text import family_header, label_value

log = logging.getLogger("dataplane.router")

# KEYS[1] lease key; ARGV: holder, demand MU/s, ask MU/s, reservation MU/s, admitted MU/s,
# ttl s, seen s, spare share, [now s for tests, else Redis TIME]. ``lease.grant`` as Lua (tests
# hold the two to the same worked numbers). Returns {granted, holders seen, others' admitted,
# contended 0/1} (floats as strings: a Lua number would be truncated to an integer).
LEASE_LUA = """
local now
if ARGV[9] and ARGV[9] ~= '' then now = tonumber(ARGV[9]) else
  local t = redis.call('TIME'); now = tonumber(t[1]) + tonumber(t[2]) / 1000000 end
local holder, demand, ask, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local admitted, ttl, seen_s = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local spare = tonumber(ARGV[8])
local raw = redis.call('GET', KEYS[1])
local st = raw and cjson.decode(raw) or {}
local live, taken, others, demands = {}, 0, 0, {demand}
local total_demand, total_ask = demand, ask
for h, l in pairs(st.l or {}) do
  if h ~= holder and l[4] > now then
    live[h] = l; taken = taken + l[3]; others = others + l[5]; demands[#demands + 1] = l[1]
    total_demand = total_demand + l[1]; total_ask = total_ask + l[2]
  end
end
local target = ask + (cap - total_ask) * spare / (#demands + 1)
if total_ask > cap then
  if total_demand <= cap then
    target = demand + (ask - demand) * (cap - total_demand) / (total_ask - total_demand)
  else
    table.sort(demands)
    local left = cap
    for i, d in ipairs(demands) do
      local share = left / (#demands - i + 1)
      if d > share then target = math.min(demand, share); break end
      left = left - d
    end
  end
end
local rate = 0
if ask > 0 then rate = math.max(0, math.min(target, cap - taken)) end
if ask > 0 or admitted > 0 then live[holder] = {demand, ask, rate, now + ttl, admitted} end
local seen, n = {}, 0
for h, t in pairs(st.s or {}) do if t > now - seen_s then seen[h] = t; n = n + 1 end end
if not seen[holder] then n = n + 1 end
seen[holder] = now
redis.call('SET', KEYS[1], cjson.encode({l = live, s = seen}), 'PX', math.floor(seen_s * 1000))
local contended = 0
if total_ask > cap then contended = 1 end
for h, l in pairs(live) do if l[3] < l[2] - 1e-9 then contended = 1 end end
return {string.format('%.6f', rate), n, string.format('%.6f', others), contended}
"""

LEASED, FALLBACK = "leased", "fallback"
DEFAULT_TERMS = LeaseTerms()


@dataclass
class Share:
    """This holder's view of one endpoint: its lease, its local GCRA, what it was asked for."""

    reservation: float  # R, MU/s (0: no reservation, the store only shares admitted rates)
    burst_s: float  # GCRA burst tolerance, s of the rate
    granted: float = 0.0  # MU/s of the last grant
    leased_until: float = -1.0  # local clock, s; before it the grant holds (-1: none yet)
    holders_seen: int = 1  # holders that renewed this endpoint recently (the store's count)
    others_admitted: float = 0.0  # MU/s the other holders admit (best-effort headroom)
    tat: float = 0.0  # the local GCRA's theoretical arrival time, s
    applied_rate: float = 0.0  # MU/s the tat was computed at
    asked_mu: float = 0.0  # MU asked for (admitted or not) since the last renewal
    admitted_mu: float = 0.0  # MU admitted (any class) since the last renewal
    demand: float = 0.0  # EWMA of asked MU/s
    admitted_rate: float = 0.0  # EWMA of admitted MU/s
    renewal_failed: bool = False  # the last renewal did not reach the store
    asked_at: float = 0.0  # local clock of the last renewal round with a request, s
    renewed_at: float = -1e9  # local clock of the last renewal answered, s
    last_ask: float = 0.0  # MU/s asked in it
    contended: bool = True  # the store said the asks exceed R (renew often until it says not)
    returned: bool = False  # idle, lease given back: kept (not renewed) while the GCRA owes MU

    def rate(self, now: float) -> float:
        """MU/s to admit at now: the lease while valid, else R / holders seen."""
        if now < self.leased_until:
            return self.granted
        return fallback_rate(self.reservation, self.holders_seen)


def holder_id() -> str:
    """This process as a lease holder: host, pid and a random suffix (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeasedLimiter:
    """GCRA at the leased rate in process; leases renewed in the background (``run``)."""

    reports_admitted = True  # what it admitted goes with its renewals, for the other routers' headroom

    def __init__(
        self,
        redis: Any,
        clock: Callable[[], float],
        terms: LeaseTerms = DEFAULT_TERMS,
        prefix: str = "mu:lease:",
        holder: str | None = None,
    ) -> None:
        self._redis = redis
        self._script = redis.register_script(LEASE_LUA)
        self._clock = clock
        self.terms = terms
        self._prefix = prefix
        self.holder = holder or holder_id()
        self.shares: dict[str, Share] = {}  # by endpoint key
        self._pending: dict[str, float] = {}  # exact - estimated MU, charged on the next check
        self._wake = asyncio.Event()
        # the most holders the store counted on any endpoint: a new endpoint's provisional split
        self._holders_seen: int | None = None
        self.mode = LEASED
        self.fallbacks = 0  # entries into fallback, count
        self.renewals = 0  # renewals answered by the store, count
        self.renewal_errors = 0  # renewals that did not reach it, count

    def _share(self, key: str, reservation: float, burst_s: float) -> Share:
        s = self.shares.get(key)
        if s is None:
            seen = self._holders_seen or self.terms.provisional_holders
            s = self.shares[key] = Share(reservation, burst_s, holders_seen=seen, asked_at=self._clock())
            self._wake.set()  # a first grant now, not at the next tick
        else:
            s.reservation, s.burst_s = reservation, burst_s
            if s.returned:
                self._wake.set()  # asked again after returning its lease: a grant now
        return s

    # --- the hot path: no await
    async def check(self, key: str, cost_mu: float, limit: GcraLimit) -> GcraDecision:
        return self.check_now(key, cost_mu, limit)

    def check_now(self, key: str, cost_mu: float, limit: GcraLimit) -> GcraDecision:
        now = self._clock()
        s = self._share(key, limit.mu_per_minute / 60.0, limit.burst_s)
        s.asked_mu += cost_mu
        rate = s.rate(now)
        if rate != s.applied_rate:
            s.tat = rescale_tat(s.tat, now, s.applied_rate, rate)
            s.applied_rate = rate
        if rate <= 0:  # oversubscribed and no room yet: the next renewal brings some
            return GcraDecision(False, self.terms.renew_s, s.tat)
        correction = self._pending.pop(key, 0.0)
        d = gcra(s.tat, now, cost_mu, GcraLimit(rate * 60.0, s.burst_s), correction)
        if d.allowed:
            s.tat = d.tat
        elif correction:
            self._pending[key] = correction  # not charged yet: keep it for the next check
        return d

    def correct(self, key: str, delta_mu: float) -> None:
        """Exact minus estimated MU of a finished request, charged on the key's next check."""
        self._pending[key] = self._pending.get(key, 0.0) + delta_mu

    def admitted(self, key: str, cost_mu: float) -> None:
        """An admitted request (any class): reported with the lease, for the others' headroom."""
        s = self.shares.get(key)
        if s is None:
            s = self._share(key, 0.0, 0.0)  # no reservation: the store shares the rate only
        s.admitted_mu += cost_mu

    def others_mu_per_min(self, key: str) -> float:
        """MU/min the endpoint's other holders admit, as of the last renewal."""
        s = self.shares.get(key)
        return 0.0 if s is None else s.others_admitted * 60.0

    # --- background: renewals
    async def run(self) -> None:
        """Each ``renew_s`` (sooner for a new endpoint): renew the leases that are due."""
        last = self._clock()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.terms.renew_s)
            self._wake.clear()
            now = self._clock()
            await self.renew_all(max(now - last, 1e-3))
            last = now

    async def renew_all(self, dt_s: float) -> None:
        """One round: fold what was asked since the last into the demand, renew the leases that
        are due concurrently, drop endpoints that went idle and returned theirs."""
        tau = self.terms.demand_tau_s
        now = self._clock()
        for s in self.shares.values():
            if s.demand:
                s.demand = ewma(s.demand, s.asked_mu / dt_s, dt_s, tau)
            else:  # a first sample: over a whole renew_s at least (a request just now is no rate)
                s.demand = s.asked_mu / max(dt_s, self.terms.renew_s)
            s.admitted_rate = ewma(s.admitted_rate, s.admitted_mu / dt_s, dt_s, tau)
            if s.asked_mu or s.admitted_mu:
                s.asked_at, s.returned = now, False
            s.asked_mu = s.admitted_mu = 0.0
            if now - s.asked_at >= self.terms.idle_s:
                s.demand = s.admitted_rate = 0.0  # idle: the lease is returned
            if s.reservation <= 0:
                s.demand = 0.0  # no reservation to lease: only the admitted rate is shared
        t = self.terms
        keys = [
            k
            for k, s in self.shares.items()
            if not s.returned
            and (
                s.renewal_failed
                or renewal_due(now, s.renewed_at, s.last_ask, ask_for(s.demand, t), s.contended, t)
            )
        ]
        if keys:
            await asyncio.gather(*(self._renew(key, self.shares[key]) for key in keys))
        for key in keys:
            s = self.shares[key]
            if s.demand == 0 and s.admitted_rate == 0 and not s.renewal_failed:
                # idle, lease returned: nothing to renew until it is asked again; until then it
                # admits as a new share does (R / holders seen), against what its GCRA still owes
                s.returned, s.leased_until = True, -1.0
        now = self._clock()
        for key in [k for k, s in self.shares.items() if s.returned and s.tat <= now]:
            del self.shares[key]  # the debt is paid: nothing left to remember
        self._set_mode(now)

    async def _renew(self, key: str, s: Share) -> None:
        t = self.terms
        ask = ask_for(s.demand, t)
        sent_at = self._clock()
        try:
            rate, seen, others, contended = await self._script(
                keys=[self._prefix + key],
                args=[
                    *(self.holder, repr(s.demand), repr(ask), repr(s.reservation), repr(s.admitted_rate)),
                    *(t.ttl_s, t.seen_s, t.spare_share),
                ],
            )
        except (RedisError, OSError, TimeoutError) as exc:
            self.renewal_errors += 1
            if not s.renewal_failed:
                log.debug("lease renewal of %s failed: %s", key, exc)
            s.renewal_failed = True
            return
        s.renewal_failed = False
        s.granted = float(rate)
        s.leased_until = sent_at + t.ttl_s  # the store's expiry is later: it started after the send
        s.holders_seen = int(seen)
        s.others_admitted = float(others)
        s.contended = bool(int(contended))
        s.renewed_at, s.last_ask = sent_at, ask
        self._holders_seen = max(self._holders_seen or 1, s.holders_seen)
        self.renewals += 1

    def _set_mode(self, now: float) -> None:
        stuck = [k for k, s in self.shares.items() if s.reservation > 0 and now >= s.leased_until]
        mode = FALLBACK if stuck and any(self.shares[k].renewal_failed for k in stuck) else LEASED
        if mode == self.mode:
            return
        self.mode = mode
        if mode == FALLBACK:
            self.fallbacks += 1
            seen = max(self.shares[k].holders_seen for k in stuck)
            log.warning(
                "limiter fallback: leases of %d endpoints expired and Redis unreachable; "
                "admitting at reservation / %d routers seen recently",
                len(stuck),
                seen,
            )
        else:
            log.warning("limiter leased again: leases renewed from Redis")

    def metrics_text(self) -> str:
        """This worker's limiter mode and counters (Prometheus text)."""
        h = f'holder="{label_value(self.holder)}"'
        out = family_header("router_limiter_mode", "gauge", "1 for the limiter's current mode")
        out += [f'router_limiter_mode{{{h},mode="{m}"}} {int(self.mode == m)}' for m in (LEASED, FALLBACK)]
        out += family_header("router_lease_fallback_total", "counter", "entries into lease fallback")
        out.append(f"router_lease_fallback_total{{{h}}} {self.fallbacks}")
        out += family_header("router_lease_renewals_total", "counter", "lease renewals answered")
        out.append(f"router_lease_renewals_total{{{h}}} {self.renewals}")
        out += family_header("router_lease_renewal_errors_total", "counter", "renewals not answered")
        out.append(f"router_lease_renewal_errors_total{{{h}}} {self.renewal_errors}")
        return "\n".join(out) + "\n"
