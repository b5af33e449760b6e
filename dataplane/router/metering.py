"""Metering: per endpoint and tenant, per second, aggregated in memory and flushed once a second.

The hot path only increments counters on a ``Stats`` object (no I/O, no allocation beyond the
first request of a key in a second). Once a second the server calls ``Meter.roll`` and hands the
rows to its delivery (``dataplane.router.delivery``), which holds them until the sink
acknowledges them: with ``--redis``, ``publish`` applies them in one script (two commands per
endpoint with traffic, whatever its tenants, and the billing entry); and once more when the
router stops (``Router.shutdown``), so that what its drain let finish or cut is billed too.

The rows are ``dataplane.wire.load_samples`` samples, the contract with the control plane that
reads them: their fields, the Redis key layout and the body posted when there is no Redis.

GET /metrics renders the cumulative counters as Prometheus text (``exposition``). With ``--workers N``
each worker has its own counters, so every worker writes a snapshot of them once a second to a
directory they share (``snapshot``), and a scrape, whichever worker it reaches, renders the sum
of all snapshots (``merge``): the multiprocess mode of the Prometheus client, in 50 lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from dataplane.router.delivery import SinkDown
from dataplane.wire.load_samples import (
    ACKED_TTL_S,
    BILLING_STREAM,
    BILLING_STREAM_MAX_ENTRIES,
    LATENCY_BUCKETS_S,
    MAX_AMOUNT,
    QueueSample,
    RouterSecond,
    Sample,
    TrafficSample,
    acked_key,
    add_fields,
    billed,
    load_key,
    routers_key,
    slot_increments,
)

Key = tuple[int, str]  # (endpoint id, tenant)


class Stats:
    __slots__ = (
        "errors",
        "inflight",
        "inflight_integral",
        "inflight_since",
        "latency_buckets",
        "latency_sum_s",
        "mu",
        "mu_squared",
        "requests",
        "throttled",
        "tokens_in",
        "tokens_out",
    )

    def __init__(self) -> None:
        self.requests = 0  # finished, count
        self.mu = 0.0  # MU
        self.mu_squared = 0.0  # each request's MU squared, summed
        self.tokens_in = 0  # tokens
        self.tokens_out = 0  # tokens
        self.latency_sum_s = 0.0  # s
        self.latency_buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)  # counts, last = +Inf
        self.errors = 0  # count
        self.throttled = 0  # 429s, count
        self.inflight = 0  # now, count
        self.inflight_integral = 0.0  # in-flight x seconds since the window began
        self.inflight_since = 0.0  # monotonic s of the last change of inflight


class Meter:
    """Current-second stats and cumulative totals per (endpoint id, tenant)."""

    def __init__(self, now: float) -> None:
        self.window_start = now  # monotonic s
        self.current: dict[Key, Stats] = {}
        self.totals: dict[Key, Stats] = {}

    def _stats(self, key: Key, now: float) -> Stats:
        s = self.current.get(key)
        if s is None:
            s = self.current[key] = Stats()
            s.inflight_since = now
        return s

    def _total(self, key: Key) -> Stats:
        t = self.totals.get(key)
        if t is None:
            t = self.totals[key] = Stats()
        return t

    def start(self, key: Key, now: float) -> None:
        s = self.current.get(key) or self._stats(key, now)  # the key's second, made once
        s.inflight_integral += s.inflight * (now - s.inflight_since)
        s.inflight_since = now
        s.inflight += 1
        (self.totals.get(key) or self._total(key)).inflight += 1

    def finish(
        self, key: Key, now: float, latency_s: float, mu: float, tokens_in: int, tokens_out: int, error: bool
    ) -> None:
        s = self.current.get(key) or self._stats(key, now)
        s.inflight_integral += s.inflight * (now - s.inflight_since)
        s.inflight_since = now
        s.inflight -= 1
        for st in (s, self.totals.get(key) or self._total(key)):
            st.requests += 1
            st.mu += mu
            st.tokens_in += tokens_in
            st.tokens_out += tokens_out
            st.latency_sum_s += latency_s
            st.errors += error
        t = self.totals[key]
        t.inflight -= 1
        i = 0
        for bound in LATENCY_BUCKETS_S:
            if latency_s <= bound:
                break
            i += 1
        s.latency_buckets[i] += 1
        t.latency_buckets[i] += 1
        s.mu_squared += mu * mu  # this second's only: nothing reads a running total of it

    def reject(self, key: Key, now: float, status: int) -> None:
        """A request answered without reaching a pod: 429 counts as throttled, 5xx as error."""
        for st in (self._stats(key, now), self._total(key)):
            if status == 429:
                st.throttled += 1
            elif status >= 500:
                st.errors += 1

    def roll(self, now: float, queued: dict[int, tuple[int, float]] | None = None) -> list[Sample]:
        """Close the current window: one sample per key with traffic; in-flight requests carry over.

        In-flight 2 for the whole of a 1 s window -> inflight 2.0; 4 for half of it -> 2.0.
        ``queued`` (endpoint id -> (waiting requests, their MU)) becomes a queue sample each.
        """
        elapsed = max(now - self.window_start, 1e-9)
        rows: list[Sample] = []
        carry: dict[Key, Stats] = {}
        for key, s in self.current.items():
            integral = s.inflight_integral + s.inflight * (now - s.inflight_since)
            rows.append(
                TrafficSample(
                    endpoint=key[0],
                    tenant=key[1],
                    requests=s.requests,
                    inflight=integral / elapsed,
                    mu=s.mu,
                    # squares grow faster than MU: bounded as the wire bounds an amount, lest a
                    # second of huge requests be refused whole (and its billing with it)
                    mu_squared=min(s.mu_squared, MAX_AMOUNT),
                    squared_requests=s.requests,
                    tokens_in=s.tokens_in,
                    tokens_out=s.tokens_out,
                    latency_ms_sum=s.latency_sum_s * 1000.0,
                    errors=s.errors,
                    throttled=s.throttled,
                    latency_buckets=tuple(s.latency_buckets),
                )
            )
            if s.inflight:
                c = carry[key] = Stats()
                c.inflight = s.inflight
                c.inflight_since = now
        self.current = carry
        self.window_start = now
        rows += [QueueSample(endpoint_id, n, mu) for endpoint_id, (n, mu) in (queued or {}).items()]
        return rows


class RateWindow:
    """MU admitted per second over the last ``seconds`` seconds, as a rate in MU/min.

    seconds=10: 50 MU admitted in each of the last 10 s -> 500 MU / 10 s x 60 = 3000 MU/min.
    """

    __slots__ = ("buckets", "seconds", "slots")

    def __init__(self, seconds: int) -> None:
        self.seconds = max(1, seconds)
        self.buckets = [0.0] * self.seconds
        self.slots = [-1] * self.seconds  # which whole second each bucket holds

    def add(self, now: float, mu: float) -> None:
        sec = int(now)
        i = sec % self.seconds
        if self.slots[i] != sec:
            self.slots[i] = sec
            self.buckets[i] = 0.0
        self.buckets[i] += mu

    def rate_per_min(self, now: float) -> float:
        sec = int(now)
        total = 0.0
        for i in range(self.seconds):
            if sec - self.seconds < self.slots[i] <= sec:
                total += self.buckets[i]
        return total * 60.0 / self.seconds


# One router's second applied once, whole (dataplane.wire.load_samples): KEYS are the router's
# mark, the second's heartbeat, the billing stream, then one load key per endpoint; ARGV the
# router, the second, the rows' TTL, the mark's TTL, the billing entry ("" for none), the
# billing stream's bound, then per load key the number of its BITFIELD arguments and those
# arguments (INCRBY i64 #slot amount), made here: a Lua loop building them cost Redis 1.5x the
# CPU of the script. 1: applied; 0: applied before; -1: the billing stream is full, nothing done.
PUBLISH_SCRIPT = """
if tonumber(ARGV[2]) <= tonumber(redis.call('GET', KEYS[1]) or '0') then return 0 end
if ARGV[5] ~= '' and redis.call('XLEN', KEYS[3]) >= tonumber(ARGV[6]) then return -1 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[4])
redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
local at = 7
for k = 4, #KEYS do
  local n = tonumber(ARGV[at])
  redis.call('BITFIELD', KEYS[k], 'OVERFLOW', 'SAT', unpack(ARGV, at + 1, at + n))
  redis.call('EXPIRE', KEYS[k], ARGV[3])
  at = at + n + 1
end
if ARGV[5] ~= '' then redis.call('XADD', KEYS[3], '*', 'second', ARGV[5]) end
return 1
"""


async def publish(
    redis: Any, posted: RouterSecond, ttl_s: int, max_billing_entries: int = BILLING_STREAM_MAX_ENTRIES
) -> bool:
    """Apply one router's second to Redis once: count the router, add per endpoint its samples
    summed over tenants (one BITFIELD INCRBY of the slots that are not zero, one EXPIRE), append
    its billable samples to the billing stream. False when the router's mark says the second
    was applied before (a retry whose first answer was lost): nothing is added. SinkDown, and
    nothing added, for a billable second while the billing stream holds ``max_billing_entries``
    (the collector stopped): the router holds it until the collector has billed some.

    Two tenants' samples of endpoint 7 (3 and 2 requests, 4.5 and 1.0 MU) -> one BITFIELD on
    mu:sec:7:{second}: INCRBY slot 0 by 5 and slot 2 (mu) by 5_500_000."""
    sums: dict[int, dict[str, float]] = {}
    for sample in posted.samples:
        add_fields(sums.setdefault(sample.endpoint, {}), sample.fields())
    keys = [acked_key(posted.router), routers_key(posted.second), BILLING_STREAM]
    slots: list[Any] = []
    for endpoint_id, fields in sums.items():
        increments = slot_increments(fields)
        if increments:
            keys.append(load_key(endpoint_id, posted.second))
            slots.append(4 * len(increments))
            for slot, by in increments:
                slots += ("INCRBY", "i64", f"#{slot}", by)
    bill = billed(posted.samples)
    entry = json.dumps(RouterSecond(posted.second, bill, posted.router).to_json()) if bill else ""
    args = [posted.router, posted.second, ttl_s, ACKED_TTL_S, entry, max_billing_entries, *slots]
    applied = await redis.register_script(PUBLISH_SCRIPT)(keys=keys, args=args)
    if applied == -1:
        raise SinkDown(f"the billing stream is full ({max_billing_entries} seconds not billed yet)")
    return bool(applied)


Snapshot = dict[str, Any]  # one worker's totals and pod gauges, JSON-able
# (endpoint id, pod, requests, MU in flight, MU not answered yet, ejected)
PodGauges = list[tuple[int, str, int, float, float, bool]]


def snapshot(totals: dict[Key, Stats], names: dict[int, str], pods: PodGauges) -> Snapshot:
    """What one worker knows, as JSON: cumulative counters per key, endpoint names, pod gauges."""
    return {
        "totals": [
            [ep, tenant, {name: getattr(st, name) for name in SNAPSHOT_FIELDS}]
            for (ep, tenant), st in totals.items()
        ],
        "names": {str(k): v for k, v in names.items()},
        "pods": [list(p) for p in pods],
    }


SNAPSHOT_FIELDS = (
    "requests", "mu", "tokens_in", "tokens_out", "latency_sum_s", "latency_buckets", "errors", "throttled",
    "inflight",
)  # fmt: skip


def merge(
    snapshots: Iterable[Snapshot],
) -> tuple[dict[Key, Stats], dict[int, str], PodGauges]:
    """The sum of the workers' snapshots: counters and gauges add up; a pod's ejection is any's.

    Worker A served 3 requests of (7, acme) and worker B 2 -> 5; pod p has 1 in flight at A
    and 2 at B -> 3 in flight. A worker from before the unanswered gauge (5 fields) adds 0."""
    totals: dict[Key, Stats] = {}
    names: dict[int, str] = {}
    pods: dict[tuple[int, str], list[Any]] = {}
    for snap in snapshots:
        for ep, tenant, fields in snap["totals"]:
            st = totals.setdefault((int(ep), str(tenant)), Stats())
            for name in SNAPSHOT_FIELDS:
                if name == "latency_buckets":
                    st.latency_buckets = [
                        a + b for a, b in zip(st.latency_buckets, fields[name], strict=True)
                    ]
                else:
                    setattr(st, name, getattr(st, name) + fields[name])
        names.update({int(k): v for k, v in snap["names"].items()})
        for ep, pod, req, mu, *unanswered, ejected in snap["pods"]:
            row = pods.setdefault((int(ep), str(pod)), [0, 0.0, 0.0, False])
            row[0] += req
            row[1] += mu
            row[2] += sum(unanswered)
            row[3] = row[3] or bool(ejected)
    return totals, names, [(ep, pod, *r) for (ep, pod), r in sorted(pods.items())]
