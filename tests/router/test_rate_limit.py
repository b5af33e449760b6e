"""429 with Retry-After beyond the reservation; reserved traffic admitted while best effort is shed."""

import asyncio

from dataplane.router.ratelimit import InProcessLimiter
from dataplane.wire.routing_table import ReservedRate
from tests.router.conftest import TENANT_KEY, assert_idle, call, cp_table, error_of, running, with_config

# alpha 0.002, beta 0.02, gamma 0.1: 40-char prompt (10 tokens), max_tokens 20 -> 0.02 + 0.4 + 0.1
# = 0.52 MU, which is also the exact price of the fake pod's usage (10 in, 20 out): no correction
BODY = {"model": "chat", "prompt": "x" * 40, "max_tokens": 20}


def test_reservation_exhausted_without_best_effort_gives_429_with_retry_after():
    async def go():
        # 12 MU/min -> 5 s per MU; burst 10 s = 2 MU: three 0.52-MU requests fit (TAT 7.8 s), the
        # fourth would take TAT to 10.4 s > 10 s
        table = cp_table(reservation=ReservedRate(12, best_effort_allowed=False))
        async with running(1, table=table, config=with_config(gcra_burst_s=10)) as (router, _):
            statuses = [(await call(router, body=BODY, key=TENANT_KEY))[0] for _ in range(4)]
            assert statuses == [200, 200, 200, 429]
            status, headers, payload = await call(router, body=BODY, key=TENANT_KEY)
            assert status == 429 and int(headers["retry-after"]) >= 1
            assert error_of(payload)["type"] == "rate_limit_error"
            assert router.meter.totals[(1, "acme")].throttled == 2
            await assert_idle(router)

    asyncio.run(go())


def test_best_effort_beyond_reservation_only_with_headroom_and_probes_always():
    async def go():
        # the reservation (12 MU/min, 2 MU burst) admits 3 requests; then best effort runs while the
        # endpoint's MU rate stays below capacity 1 pod x 30 MU/min: after n admitted requests the
        # 10-s window holds 0.52 n MU -> 6 x 0.52 n MU/min; + 0.52 < 30 while n <= 9
        table = cp_table(reservation=ReservedRate(12, best_effort_allowed=True), mu_per_replica_minute=30)
        async with running(1, table=table, probe_key=b"probe-secret") as (router, _):
            statuses = [(await call(router, body=BODY, key=TENANT_KEY))[0] for _ in range(12)]
            assert statuses == [200] * 10 + [429] * 2
            # a probe (the prober credential in x-probe) is never shed; a tenant's own claims are
            headers = {"x-probe": "probe-secret"}
            assert (await call(router, body=BODY, key=TENANT_KEY, headers=headers))[0] == 200
            assert (await call(router, body=BODY, key=TENANT_KEY, headers={"x-probe": "1"}))[0] == 429
            assert (await call(router, body={**BODY, "priority": -10_000}, key=TENANT_KEY))[0] == 429
            await assert_idle(router)

    asyncio.run(go())


def test_reserved_traffic_is_admitted_while_best_effort_is_shed():
    async def go():
        # capacity 0.5 MU/min (1 pod x 0.5): never headroom for a 0.52-MU best-effort request;
        # requests within a generous reservation (6000 MU/min) still pass
        table = cp_table(reservation=ReservedRate(6000, best_effort_allowed=True), mu_per_replica_minute=0.5)
        async with running(1, table=table) as (router, _):
            statuses = [(await call(router, body=BODY, key=TENANT_KEY))[0] for _ in range(10)]
            assert statuses == [200] * 10  # all within the reservation
        table = cp_table(reservation=None, mu_per_replica_minute=0.5)  # the same, all best effort
        async with running(1, table=table) as (router, _):
            statuses = [(await call(router, body=BODY, key=TENANT_KEY))[0] for _ in range(3)]
            assert statuses == [429, 429, 429]

    asyncio.run(go())


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_large_estimate_refunded_leaves_the_reservation_to_the_next_request():
    async def go():
        # 100 MU/min (0.6 s per MU), burst 10 s: max_tokens 3000 is estimated at 0.02 + 60 + 0.1 =
        # 60.12 MU, 36 s of rate (larger than the burst: it runs from an empty bucket only), and
        # costs the fake pod's usage, 0.52 MU (0.31 s). The refund is applied before the next
        # request is judged: 1 s later the bucket is empty and the next one runs, three times
        # (before: TAT 36 s refused the second for 26 s, 0.52 MU of the minute used)
        table = cp_table(reservation=ReservedRate(100, best_effort_allowed=False))
        big = {**BODY, "max_tokens": 3000}
        clock = Clock()
        limiter = InProcessLimiter(clock)
        config = with_config(gcra_burst_s=10)
        async with running(1, table=table, config=config, limiter=limiter) as (router, _):
            statuses = []
            for _ in range(3):
                statuses.append((await call(router, body=big, key=TENANT_KEY))[0])
                clock.t += 1.0
            assert statuses == [200, 200, 200]
            await assert_idle(router)

    asyncio.run(go())
