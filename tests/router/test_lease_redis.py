"""The lease Lua script and the leased limiter against real Redis: the script grants what
``lease.grant`` computes; the limiter admits at its lease with no Redis call per request; with
Redis stopped (a redis-server of this test's own) it keeps the lease until it expires, then
falls back to R / routers seen, and says so in its metrics and one log line each way."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from dataplane.router.lease import LeaseTerms, ask_for
from dataplane.router.lease_limiter import FALLBACK, LEASE_LUA, LEASED, LeasedLimiter
from dataplane.router.ratelimit import GcraLimit
from tests.router.conftest import free_port
from tests.router.test_lease import Store

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")
TERMS = LeaseTerms(margin=0.05)  # the worked numbers' margin
LIMIT = GcraLimit(mu_per_minute=6000, burst_s=1)  # 100 MU/s, 100 MU of burst


async def shared_redis() -> Redis:
    redis = Redis.from_url(REDIS_URL, socket_timeout=2)
    try:
        await redis.ping()
    except Exception as exc:  # pragma: no cover - CI starts Redis (.ci/run)
        await redis.aclose()
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    return redis


@contextlib.asynccontextmanager
async def limiters(
    *holders: str, start: float = 0.0
) -> AsyncIterator[tuple[Redis, list[float], list[LeasedLimiter]]]:
    """Leased limiters on the shared Redis, one per holder, under a key prefix of their own and
    on one fake clock (``now[0]``, from ``start``); the prefix's keys are deleted after."""
    redis = await shared_redis()
    now = [start]
    prefix = f"test:lease:{uuid.uuid4().hex}:"
    try:
        yield (
            redis,
            now,
            [LeasedLimiter(redis, lambda: now[0], TERMS, prefix=prefix, holder=h) for h in holders],
        )
    finally:
        stale = await redis.keys(prefix + "*")
        if stale:
            await redis.delete(*stale)
        await redis.aclose()


@contextlib.contextmanager
def own_redis_server(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """A redis-server of this test on 127.0.0.1:port, nothing saved; stopped on exit."""
    exe = shutil.which("redis-server")
    if exe is None:  # pragma: no cover - CI has redis-server
        pytest.skip("no redis-server on PATH")
    proc = subprocess.Popen(
        [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while (
            subprocess.run(
                ["redis-cli", "-p", str(port), "ping"], capture_output=True, check=False
            ).stdout.strip()
            != b"PONG"
        ):
            assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
            time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_the_script_grants_what_the_arithmetic_computes():
    async def go() -> None:
        redis = await shared_redis()
        script = redis.register_script(LEASE_LUA)
        key = f"test:lease:{uuid.uuid4().hex}"
        store = Store()
        steps = [("a", 140, 0.0), ("b", 40, 0.05), ("a", 140, 0.25), ("b", 40, 0.3), ("c", 10, 0.35)]
        steps += [("a", 140, 0.5), ("c", 10, 0.6), ("b", 0, 0.7), ("a", 140, 3.4), ("c", 10, 3.45)]
        steps += [("d", 30, 3.5), ("d", 38, 3.6), ("c", 20, 3.7), ("d", 38, 3.8), ("c", 5, 3.9)]
        try:
            for holder, demand, now in steps:
                ask = ask_for(demand, TERMS)
                args = [holder, demand, ask, 100, demand / 2, TERMS.ttl_s, TERMS.seen_s, TERMS.spare_share]
                args.append(1e9 + now)
                rate, seen, others, contended = await script(keys=[key], args=args)
                want = store.renew(holder, demand, 1e9 + now, admitted=demand / 2)
                assert (float(rate), int(seen), float(others), bool(contended)) == pytest.approx(
                    (want.rate, want.holders_seen, want.others_admitted, want.contended), abs=1e-5
                ), (holder, demand, now)
            assert 0 < await redis.pttl(key) <= TERMS.seen_s * 1000
        finally:
            await redis.delete(key)
            await redis.aclose()

    asyncio.run(go())


def test_two_limiters_split_the_reservation_and_requests_never_call_redis():
    async def go() -> None:
        async with limiters("big", "small") as (redis, now, (big, small)):
            before = (await redis.info("stats"))["total_commands_processed"]
            # first requests, before any grant: R / provisional_holders, from an empty bucket
            assert big.check_now("ep", 5.0, LIMIT).allowed and small.check_now("ep", 2.5, LIMIT).allowed
            assert (await redis.info("stats"))["total_commands_processed"] == before + 1  # INFO itself
            # demand over 0.25 s: big asks for 140 MU/s, small for 10 MU/s (35 MU and 2.5 MU)
            for r in range(3):  # (the first requests above count in the first round)
                for _ in range(7 if r else 6):
                    big.check_now("ep", 5.0, LIMIT)
                if r:
                    small.check_now("ep", 2.5, LIMIT)
                now[0] += 0.25
                await big.renew_all(0.25)
                await small.renew_all(0.25)
            b, s = big.shares["ep"], small.shares["ep"]
            assert b.granted + s.granted <= 100 + 1e-6
            assert (b.demand, s.demand) == pytest.approx((140, 10))
            assert s.granted == pytest.approx(10)  # below the fair level: all its demand
            assert b.granted == pytest.approx(90)  # the rest of R
            assert b.holders_seen == s.holders_seen == 2 and big.mode == small.mode == LEASED
            # admission runs at the lease (valid until 0.75 + 3 s): from an empty bucket, 1 s of it
            now[0] += 2.0
            got = 0.0
            while big.check_now("ep", 1.0, LIMIT).allowed:
                got += 1
            assert got == pytest.approx(b.granted * LIMIT.burst_s, abs=1.5)

    asyncio.run(go())


@pytest.mark.stack
def test_redis_away_keeps_the_lease_until_it_expires_then_falls_back(caplog):
    port = free_port()

    async def go(server: subprocess.Popen[bytes]) -> None:
        redis = Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_timeout=0.5, socket_connect_timeout=0.5)
        now = [0.0]
        lims = [LeasedLimiter(redis, lambda: now[0], TERMS, holder=h) for h in ("a", "b", "c", "d")]
        try:
            for _ in range(8):  # 40 MU/s of demand each, for 2 s
                for lim in lims:
                    lim.check_now("ep", 10.0, LIMIT)
                    await lim.renew_all(0.25)
                now[0] += 0.25
            # the first one alone took 56.5 (42 + 58 x 0.5 / 2) and learnt of the others at its
            # steady renewal (1 s); contended since (4 x 42 > 100): 25 each
            assert [lim.shares["ep"].granted for lim in lims] == pytest.approx([25] * 4)
            a = lims[0]
            assert a.shares["ep"].holders_seen == 4
            server.kill()
            server.wait()
            now[0] += 0.5
            a.check_now("ep", 10.0, LIMIT)
            await a.renew_all(0.5)  # Redis away, the lease (3 s from 1.75) still valid: leased
            assert a.mode == LEASED and a.renewal_errors == 1 and a.shares["ep"].rate(now[0]) == 25
            now[0] += 2.5  # past the lease (4.75 s)
            a.check_now("ep", 10.0, LIMIT)
            with caplog.at_level(logging.WARNING, logger="dataplane.router"):
                await a.renew_all(2.5)
                await a.renew_all(0.25)  # still away: no second line
            assert a.mode == FALLBACK and a.fallbacks == 1
            assert a.shares["ep"].rate(now[0]) == 25  # R / 4 routers seen
            assert 'router_limiter_mode{holder="a",mode="fallback"} 1' in a.metrics_text()
            assert 'router_lease_fallback_total{holder="a"} 1' in a.metrics_text()
            assert [r.message for r in caplog.records if "fallback" in r.message] == [
                "limiter fallback: leases of 1 endpoints expired and Redis unreachable; "
                "admitting at reservation / 4 routers seen recently"
            ]
            caplog.clear()
            with own_redis_server(port):  # Redis back (empty: the others' leases are gone)
                with caplog.at_level(logging.WARNING, logger="dataplane.router"):
                    a.check_now("ep", 10.0, LIMIT)
                    await a.renew_all(0.25)
                s = a.shares["ep"]
                ask = ask_for(s.demand, TERMS)
                assert a.mode == LEASED and s.granted == pytest.approx(ask + (100 - ask) / 4, abs=1e-5)
                back = "limiter leased again: leases renewed from Redis"
                assert [r.message for r in caplog.records] == [back]
                assert 'router_limiter_mode{holder="a",mode="leased"} 1' in a.metrics_text()
        finally:
            await redis.aclose()

    with own_redis_server(port) as server:
        asyncio.run(go(server))


def test_an_uncontended_steady_lease_is_renewed_once_a_second():
    async def go() -> None:
        async with limiters("alone") as (_, now, (lim,)):
            for _ in range(40):  # 10 s at 40 MU/s of a 100 MU/s reservation, renewal ticks of 0.25 s
                lim.check_now("ep", 10.0, LIMIT)
                now[0] += 0.25
                await lim.renew_all(0.25)
            assert lim.renewals == 10  # each steady_renew_s, not 40
            s = lim.shares["ep"]
            assert not s.contended and s.granted == pytest.approx(42 + 58 / 4)  # ask + half the spare / 2
            for _ in range(2):  # demand doubles: renewed each tick while it moves (+22 %, +15 %)
                lim.check_now("ep", 20.0, LIMIT)
                now[0] += 0.25
                await lim.renew_all(0.25)
            ask = ask_for(s.demand, TERMS)
            assert lim.renewals == 12 and s.granted == pytest.approx(ask + (100 - ask) / 4, abs=1e-5)

    asyncio.run(go())


def test_a_debt_is_kept_when_the_tenant_goes_idle_until_it_is_paid():
    """One request priced at 60 s of R (admitted from an empty bucket) leaves 60 s of debt; the
    tenant going idle returns its lease, not its debt: 8.5 s later a second such request still
    waits, and once the debt is paid the share is dropped and a request runs again."""

    async def go() -> None:
        async with limiters("h", start=1000.0) as (_, now, (lim,)):
            huge = 60 * 100.0  # 6,000 MU: 60 s of the reservation
            assert lim.check_now("ep", huge, LIMIT).allowed
            await lim.renew_all(0.25)
            now[0] += 1
            assert not lim.check_now("ep", 1.0, LIMIT).allowed  # in debt
            for _ in range(30):  # 7.5 s of renewal rounds, no request: idle, the lease returned
                now[0] += 0.25
                await lim.renew_all(0.25)
            assert lim.shares["ep"].returned
            assert not lim.check_now("ep", huge, LIMIT).allowed  # ~51 s still owed
            for _ in range(60 * 4):  # a minute of rounds, no request
                now[0] += 0.25
                await lim.renew_all(0.25)
            assert "ep" not in lim.shares  # paid: nothing left to remember
            assert lim.check_now("ep", huge, LIMIT).allowed

    asyncio.run(go())


def test_fresh_holders_together_admit_about_one_burst_before_their_first_grant():
    """Four fresh workers (a restart, a scale-out), no grant yet: each admits at R /
    provisional_holders with the burst scaled to it, so together about burst_s x R (100 MU),
    not a full burst each; after the store's first answer a new endpoint splits by its count."""

    async def go() -> None:
        async with limiters("h0", "h1", "h2", "h3", start=1000.0) as (_, now, holders):
            admitted = 0.0
            for lim in holders:
                while lim.check_now("ep", 10.0, LIMIT).allowed and admitted <= 10_000:
                    admitted += 10.0
            assert admitted <= 100.0 * LIMIT.burst_s + 10.0, admitted
            for lim in holders:
                await lim.renew_all(0.25)
            assert holders[0].shares["ep"].holders_seen == 1 and holders[3].shares["ep"].holders_seen == 4
            holders[3].check_now("other", 1.0, LIMIT)  # a new endpoint: the most seen on any, 4
            assert holders[3].shares["other"].rate(now[0]) == pytest.approx(100.0 / 4)

    asyncio.run(go())


def test_two_static_router_fleets_on_one_redis_share_a_lease_unless_namespaced(monkeypatch):
    """Every static table's endpoint is id 0 and control planes' ids overlap: the deployment is
    in the lease key. One command line (the same static fleet) shares; a second static fleet
    with its own --limiter-namespace, or another control plane, has its own reservation."""
    from dataplane.router.__main__ import lease_prefix, parse_args

    static = ["--backends", "http://10.0.0.1:8000", "--rate-limit-mu-per-min", "6000", "--redis", REDIS_URL]
    assert lease_prefix(parse_args(static)) == lease_prefix(parse_args(static))  # one fleet: shared
    monkeypatch.setenv("ROUTER_KEY", "k")
    assert lease_prefix(parse_args(["--control-plane", "http://cp-a/"])) != lease_prefix(
        parse_args(["--control-plane", "http://cp-b"])
    )
    ns = f"test-{uuid.uuid4().hex}"
    prefixes = [lease_prefix(parse_args([*static, "--limiter-namespace", f"{ns}-{f}"])) for f in "ab"]

    async def go() -> None:
        redis = await shared_redis()
        now = [1000.0]
        fleets = [LeasedLimiter(redis, lambda: now[0], TERMS, prefix=p, holder="h") for p in prefixes]
        try:
            for _ in range(40):  # 10 s, each fleet asks 100 MU/s of its own 100 MU/s reservation
                for lim in fleets:
                    lim.check_now("0", 25.0, LIMIT)
                now[0] += 0.25
                for lim in fleets:
                    await lim.renew_all(0.25)
            assert [lim.shares["0"].granted for lim in fleets] == pytest.approx([100.0, 100.0])
        finally:
            await redis.delete(*(p + "0" for p in prefixes))
            await redis.aclose()

    asyncio.run(go())


def test_a_refund_reaches_the_leased_bucket_before_the_next_request_is_judged():
    """A request estimated at 60 s of R (from an empty bucket) that cost 1 MU leaves no debt: the
    refund is applied to the bucket before the next request is judged, so 1 s later another
    such request runs (folded into its cost, the 60 s of the first estimate refused it)."""

    async def go() -> None:
        async with limiters("h", start=1000.0) as (_, now, (lim,)):
            huge = 60 * 100.0  # 6,000 MU: 60 s of the reservation
            assert lim.check_now("ep", huge, LIMIT).allowed
            await lim.renew_all(0.25)
            lim.correct("ep", 1.0 - huge)
            now[0] += 1
            assert lim.check_now("ep", huge, LIMIT).allowed
            now[0] += 1
            assert not lim.check_now("ep", huge, LIMIT).allowed  # this one was not refunded

    asyncio.run(go())
