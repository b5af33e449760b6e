"""The GCRA Lua script against the real Redis at REDIS_URL (default redis://127.0.0.1:6379/15)."""

import asyncio
import os
import uuid

import pytest
from redis.asyncio import Redis

from dataplane.router.ratelimit import GcraLimit, InProcessLimiter, RedisLimiter

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")
LIMIT = GcraLimit(mu_per_minute=600, burst_s=10)


def run_with_redis(scenario):
    async def go():
        redis = Redis.from_url(REDIS_URL, socket_timeout=2)
        try:
            await redis.ping()
        except Exception as exc:  # pragma: no cover - CI starts Redis (.ci/run)
            await redis.aclose()
            pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
        try:
            await scenario(redis)
        finally:
            await redis.aclose()

    asyncio.run(go())


def test_redis_gcra_matches_the_worked_numbers_on_a_fake_clock():
    async def scenario(redis):
        now = [1000.0]
        lim = RedisLimiter(redis, prefix=f"test:gcra:{uuid.uuid4().hex}:", now_for_tests=lambda: now[0])
        for _ in range(20):
            assert (await lim.check("ep", 5.0, LIMIT)).allowed
        d = await lim.check("ep", 5.0, LIMIT)
        assert not d.allowed and d.retry_after_s == pytest.approx(0.5, abs=1e-5)
        now[0] += 0.5
        assert (await lim.check("ep", 5.0, LIMIT)).allowed

    run_with_redis(scenario)


def test_redis_gcra_is_shared_by_two_limiters_and_expires():
    async def scenario(redis):
        prefix = f"test:gcra:{uuid.uuid4().hex}:"
        a, b = RedisLimiter(redis, prefix=prefix), RedisLimiter(redis, prefix=prefix)  # Redis TIME
        for i in range(20):
            assert (await (a if i % 2 else b).check("ep", 5.0, LIMIT)).allowed
        assert not (await a.check("ep", 5.0, LIMIT)).allowed
        assert not (await b.check("ep", 5.0, LIMIT)).allowed
        ttl = await redis.pttl(prefix + "ep")
        assert 0 < ttl <= 11_000  # (TAT - now) + 1 s

    run_with_redis(scenario)


def test_redis_down_falls_back_to_in_process():
    async def go():
        redis = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
        lim = RedisLimiter(redis, fallback=InProcessLimiter(lambda: 0.0))
        try:
            assert (await lim.check("ep", 5.0, LIMIT)).allowed
            assert lim.errors == 1
        finally:
            await redis.aclose()

    asyncio.run(go())
