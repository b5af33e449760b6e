"""Per-second metering: time-averaged in-flight, the MU rate window, Redis rows, worker snapshots."""

import asyncio
import json
import os
import struct
import uuid

import pytest

from dataplane.router.metering import Meter, RateWindow, publish
from dataplane.wire.load_samples import (
    BILLING_STREAM,
    MAX_AMOUNT,
    SLOTS,
    EndpointSecond,
    QueueSample,
    RouterSecond,
    TrafficSample,
    acked_key,
    load_key,
    routers_key,
)
from tests.conftest import latencies

KEY = (7, "acme")


def test_roll_reports_time_averaged_inflight_and_sums():
    m = Meter(now=100.0)
    m.start(KEY, 100.0)
    m.start(KEY, 100.0)  # 2 in flight for 0.5 s
    m.finish(KEY, 100.5, 0.5, mu=1.5, tokens_in=10, tokens_out=20, error=False)  # 1 for 0.5 s
    rows = m.roll(101.0)
    assert rows == [
        TrafficSample(
            *KEY,
            requests=1,
            inflight=pytest.approx(1.5),
            mu=1.5,
            mu_squared=2.25,
            squared_requests=1,  # every request's square is in mu_squared
            tokens_in=10,
            tokens_out=20,
            latency_ms_sum=500.0,
            errors=0,
            throttled=0,
            latency_buckets=latencies({6: 1}),  # 0.5 s lies in (0.25, 0.5], LATENCY_BUCKETS_S[6]
        )
    ]
    # the request still in flight carries into the next second: 1 for the whole of it
    rows = m.roll(102.0)
    assert rows[0].inflight == pytest.approx(1.0) and rows[0].requests == 0
    m.finish(KEY, 102.2, 2.2, 1.0, 1, 1, True)
    m.reject(KEY, 102.3, 429)
    rows = m.roll(103.0)
    assert rows[0].inflight == pytest.approx(0.2) and rows[0].errors == 1
    assert rows[0].throttled == 1
    assert m.roll(104.0) == []  # idle keys leave the table
    # waiting requests, per endpoint, on a row of their own
    assert m.roll(105.0, queued={7: (3, 1.5)}) == [QueueSample(7, queued=3, queued_mu=1.5)]
    t = m.totals[KEY]
    assert (t.requests, t.inflight, t.errors, t.throttled) == (2, 0, 1, 1)
    m.finish(KEY, 105.5, 0.5, 2.0, 1, 1, False)
    m.finish(KEY, 105.6, 0.5, 3.0, 1, 1, False)
    assert m.roll(106.0)[0].mu_squared == 13.0  # each request's MU squared: 4 + 9, not 5 x 5
    m.finish(KEY, 106.5, 0.5, 2e6, 1, 1, False)  # 4e12 MU^2: bounded as the wire bounds an amount
    assert m.roll(107.0)[0].mu_squared == MAX_AMOUNT


def test_rate_window_in_mu_per_minute():
    w = RateWindow(10)
    for s in range(10):
        w.add(1000 + s + 0.5, 50.0)
    assert w.rate_per_min(1009.9) == pytest.approx(3000.0)  # 500 MU / 10 s x 60
    assert w.rate_per_min(1015.0) == pytest.approx(1200.0)  # seconds 1006-1009 remain: 200 MU
    assert w.rate_per_min(1100.0) == 0.0


def test_publish_to_redis_key_layout():
    from redis.asyncio import Redis

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")

    async def go():
        redis = Redis.from_url(url, socket_timeout=2)
        try:
            await redis.ping()
        except Exception as exc:  # pragma: no cover
            await redis.aclose()
            pytest.skip(f"no Redis at {url}: {exc}")
        endpoint = int(uuid.uuid4().int % 10**9) + 10**9
        try:
            # two tenants of one router: summed before they reach Redis, one BITFIELD for both
            acme = TrafficSample(
                endpoint,
                "acme",
                requests=3,
                inflight=1.5,
                mu=4.5,
                tokens_in=30,
                tokens_out=60,
                latency_ms_sum=90.0,
                errors=0,
                throttled=1,
                latency_buckets=latencies({1: 2, 3: 1}),
                mu_squared=6.75,
                squared_requests=3,
            )
            # a router from before the squares: its request's MU comes without them
            beta = TrafficSample(endpoint, "beta", requests=1, mu=0.25, tokens_in=5, latency_ms_sum=2.5)
            queue = QueueSample(endpoint, queued=2, queued_mu=1.5)
            assert await publish(redis, RouterSecond(1_700_000_000, (acme, beta, queue), "router-a"), 120)
            # a second router adds its share
            assert await publish(redis, RouterSecond(1_700_000_000, (acme,), "router-b"), 120)
            key = load_key(endpoint, 1_700_000_000)
            raw = await redis.get(key)
            # the string's int64 slots: counts as they are, amounts in millionths; slots past
            # the highest one written (squared_requests is the last) read as zero
            assert len(raw) == 8 * 27
            slots = dict(zip(SLOTS, struct.unpack(">27q", raw), strict=True))
            assert (slots["requests"], slots["mu"], slots["tokens_in"], slots["tokens_out"]) == (
                7,
                9_250_000,  # 4.5 + 0.25 + 4.5 MU
                65,
                120,
            )
            assert (slots["inflight"], slots["latency_ms_sum"], slots["throttled"]) == (
                3_000_000,
                182_500_000,
                2,
            )
            assert (slots["lat1"], slots["lat3"], slots["queued"], slots["queued_mu"]) == (4, 2, 2, 1_500_000)
            assert slots["mu_squared"] == 13_500_000  # 6.75 MU^2 from each router
            assert slots["squared_requests"] == 6  # of the 7 requests: beta's came without
            assert EndpointSecond.from_redis_slots(raw) == EndpointSecond(
                requests=7.0,
                inflight=3.0,
                mu=9.25,
                tokens_in=65.0,
                tokens_out=120.0,
                latency_ms_sum=182.5,
                throttled=2.0,
                latency_buckets=tuple(map(float, latencies({1: 4, 3: 2}))),
                queued=2.0,
                queued_mu=1.5,
                mu_squared=13.5,
                squared_requests=6.0,
            )
            # a second with only requests wrote one slot: the rest are zeros
            short = load_key(endpoint, 1_700_000_001)
            only = RouterSecond(1_700_000_001, (TrafficSample(endpoint, "acme", requests=2),), "router-a")
            assert await publish(redis, only, 120)
            assert await redis.get(short) == struct.pack(">q", 2)
            assert EndpointSecond.from_redis_slots(await redis.get(short)) == EndpointSecond(requests=2.0)
            await redis.delete(short, routers_key(1_700_000_001), BILLING_STREAM)
            assert 0 < await redis.ttl(key) <= 120
            # every publish says its router was up that second, traffic or not
            assert await publish(redis, RouterSecond(1_700_000_000, (), "router-c"), 120)
            assert await redis.get(routers_key(1_700_000_000)) == b"3"
            await redis.delete(
                key, routers_key(1_700_000_000), *(acked_key(r) for r in ("router-a", "router-b", "router-c"))
            )
        finally:
            await redis.aclose()

    asyncio.run(go())


def test_workers_snapshots_add_up():
    from dataplane.router.metering import merge, snapshot

    a, b = Meter(0.0), Meter(0.0)
    for m, n in ((a, 3), (b, 2)):
        for _ in range(n):
            m.start(KEY, 0.0)
            m.finish(KEY, 0.03, 0.03, 2.0, 5, 6, False)
    a.start(KEY, 1.0)  # one still in flight at worker A
    snaps = [
        snapshot(a.totals, {7: "chat"}, [(7, "pod-0", 1, 2.5, 2.5, False)]),
        snapshot(b.totals, {7: "chat"}, [(7, "pod-0", 2, 1.0, 0.5, True)]),
    ]
    totals, names, pods = merge(json.loads(json.dumps(s)) for s in snaps)  # as read from the files
    t = totals[KEY]
    assert (t.requests, t.mu, t.inflight, sum(t.latency_buckets)) == (5, 10.0, 1, 5)
    assert names == {7: "chat"} and pods == [(7, "pod-0", 3, 3.5, 3.0, True)]
    # A worker still running the version before the unanswered gauge (five fields) adds none.
    before = {"totals": [], "names": {}, "pods": [[7, "pod-0", 1, 1.0, False]]}
    assert merge([*snaps, before])[2] == [(7, "pod-0", 4, 4.5, 3.0, True)]
