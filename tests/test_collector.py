"""The collect stage (controlplane.endpoints.collector): its own lease, billing apart from the
buckets and from the deciders, a late second billed once on either sink, a retried second
never twice."""

from datetime import UTC, datetime, timedelta

import pytest

from controlplane import scaling
from controlplane.endpoints import collector, tasks
from controlplane.endpoints.models import Lease, LoadBucket, UsageHour
from dataplane.wire.load_samples import BILLING_STREAM, RouterSecond, TrafficSample

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
TS = int(NOW.timestamp())  # a multiple of 5


def billed(endpoint) -> tuple[int, float]:
    rows = UsageHour.objects.filter(endpoint_id=endpoint.pk)
    return sum(r.requests for r in rows), sum(r.mu for r in rows)


def pass_at(ts: float) -> collector.CollectReport:
    report = collector.collect_pass(datetime.fromtimestamp(ts, UTC))
    assert report is not None
    return report


@pytest.fixture
def chat(owner, make_endpoint):
    return make_endpoint(owner, "chat")


def test_a_second_published_after_its_slot_was_collected_is_billed_once(publish_seconds, metrics, chat):
    one = TrafficSample(chat.pk, "owner", requests=2, mu=0.5)
    publish_seconds({TS - 3: [[one]]})
    pass_at(TS + 2)  # collects the slot ending at TS, bills the second
    assert billed(chat) == (2, 0.5) and LoadBucket.objects.get(endpoint=chat, end=TS).requests == 2
    # A router that could not reach Redis sends TS - 4 now: too late for the bucket, not for the bill.
    publish_seconds({TS - 4: [[one]]})
    pass_at(TS + 7)
    assert billed(chat) == (4, 1.0) and LoadBucket.objects.get(endpoint=chat, end=TS).requests == 2
    assert metrics.xlen(BILLING_STREAM) == 0  # billed entries are deleted


def test_a_second_republished_by_its_router_adds_nothing(metrics, chat):
    import asyncio
    import os

    from redis.asyncio import Redis

    from dataplane.router.metering import publish

    posted = RouterSecond(TS - 3, (TrafficSample(chat.pk, "owner", requests=3, mu=1.5),), "router-a")
    older = RouterSecond(TS - 9, posted.samples, "router-a")

    async def go() -> list[bool]:
        client = Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"))
        try:
            return [await publish(client, p, 420) for p in (posted, posted, older)]
        finally:
            await client.aclose()

    # The retry of a second whose answer was lost, and an older one (below the router's mark).
    assert asyncio.run(go()) == [True, False, False]
    assert metrics.xlen(BILLING_STREAM) == 1
    pass_at(TS + 2)
    assert billed(chat) == (3, 1.5) and LoadBucket.objects.get(endpoint=chat, end=TS).requests == 3


def test_without_redis_a_late_post_is_billed_and_a_repeated_one_is_a_duplicate(
    settings, operator_client, chat
):
    settings.REDIS_URL = ""
    rows = (TrafficSample(chat.pk, "owner", requests=1, mu=0.25),)

    def post(second: int):
        return operator_client.post(
            "/api/v1/load-samples/", RouterSecond(second, rows, "router-a").to_json(), format="json"
        )

    assert post(TS - 3).status_code == 201
    pass_at(TS + 2)
    assert billed(chat) == (1, 0.25)
    # Days later, within retention: a second the router held through an outage.
    late = post(TS - 2)
    assert (late.status_code, late.json()) == (201, {"stored": 1})
    again = post(TS - 2)  # its answer was lost: the router sends it again
    assert (again.status_code, again.json()) == (200, {"stored": 0, "duplicate": True})
    pass_at(TS + 86400 * 3)
    pass_at(TS + 86400 * 3 + 5)
    assert billed(chat) == (2, 0.5)


def test_the_collector_bills_while_the_deciders_lease_is_held_and_without_them(
    publish_seconds, chat, settings
):
    # A horizontal pass hung (its worker died holding the lease): the collector goes on.
    Lease.objects.create(
        name=scaling.HORIZONTAL, holder="dead-worker", expires_at=NOW + timedelta(seconds=60)
    )
    publish_seconds({TS - 3: [[TrafficSample(chat.pk, "owner", requests=4, mu=1.0)]]})
    assert scaling.horizontal_pass(None, NOW + timedelta(seconds=2)) is None
    assert billed(chat) == (4, 1.0)  # the pass ran its collect pass before finding its lease held
    publish_seconds({TS + 1: [[TrafficSample(chat.pk, "owner", requests=1, mu=1.0)]]})
    Lease.objects.filter(name=collector.COLLECTOR).update(last_run_at=None)
    assert tasks.collect_load().startswith("collected through")  # beat's own task
    assert billed(chat) == (5, 2.0)


def test_a_stream_entry_that_is_no_router_second_is_dropped_not_blocking(publish_seconds, metrics, chat):
    metrics.xadd(BILLING_STREAM, {"second": b"{not json"})
    publish_seconds({TS - 3: [[TrafficSample(chat.pk, "owner", requests=1, mu=1.0)]]})
    assert pass_at(TS + 2).billed == 2
    assert billed(chat) == (1, 1.0) and metrics.xlen(BILLING_STREAM) == 0


def test_a_second_in_the_billing_stream_twice_is_billed_once(metrics, chat):
    import asyncio
    import os

    from redis.asyncio import Redis

    from dataplane.router.metering import publish
    from dataplane.wire.load_samples import acked_key

    posted = RouterSecond(TS - 3, (TrafficSample(chat.pk, "owner", requests=3, mu=1.5),), "router-a")

    async def go() -> list[bool]:
        client = Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"))
        try:
            first = await publish(client, posted, 420)
            # Its router's mark lost before the retry of a second whose answer was lost (evicted
            # at maxmemory, expired, a failover): Redis takes the second again.
            await client.delete(acked_key("router-a"))
            return [first, await publish(client, posted, 420)]
        finally:
            await client.aclose()

    assert asyncio.run(go()) == [True, True]
    assert metrics.xlen(BILLING_STREAM) == 2
    pass_at(TS + 2)
    assert billed(chat) == (3, 1.5) and metrics.xlen(BILLING_STREAM) == 0


def test_a_router_back_after_its_mark_would_have_expired_is_not_billed_twice(settings, operator_client, chat):
    from django.utils import timezone

    from controlplane.endpoints.models import RouterMark

    settings.REDIS_URL = ""
    rows = (TrafficSample(chat.pk, "owner", requests=1, mu=0.25),)

    def post(second: int):
        return operator_client.post(
            "/api/v1/load-samples/", RouterSecond(second, rows, "router-a").to_json(), format="json"
        )

    assert post(TS - 3).status_code == 201
    pass_at(TS + 2)
    # Its answer was lost and the router cut off for 8 days (its spool kept the second), all the
    # while the collector ran and swept marks; usage keeps that hour far longer.
    RouterMark.objects.filter(router="router-a").update(updated_at=timezone.now() - timedelta(days=8))
    assert tasks.collect_load().startswith("collected through")
    again = post(TS - 3)
    assert (again.status_code, again.json()) == (200, {"stored": 0, "duplicate": True})
    Lease.objects.filter(name=collector.COLLECTOR).update(last_run_at=None)
    assert tasks.collect_load().startswith("collected through")
    assert billed(chat) == (1, 0.25)


def test_a_full_billing_stream_holds_a_routers_seconds_until_the_collector_has_billed(metrics, chat):
    import asyncio
    import os

    from redis.asyncio import Redis

    from dataplane.router.delivery import Delivery
    from dataplane.router.metering import publish
    from dataplane.wire.load_samples import acked_key

    client: list[Redis] = []

    async def send(posted: RouterSecond) -> None:
        await publish(client[0], posted, 420, max_billing_entries=2)  # the collector stopped at 2

    delivery = Delivery(send, "router-a", 1 << 20)

    def deliver(*seconds: int) -> int:
        async def go() -> int:
            client[:] = [Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"))]
            try:
                sent = 0
                for second in seconds:
                    delivery.add([TrafficSample(chat.pk, "owner", requests=1, mu=0.5)], second)
                    sent += await delivery.deliver()
                return sent + await delivery.deliver()
            finally:
                await client[0].aclose()

        return asyncio.run(go())

    assert deliver(TS - 4, TS - 3, TS - 2) == 2
    # Redis took nothing of the third: its router's mark has not moved, the stream is at its bound.
    assert [h.second for h in delivery.held] == [TS - 2]
    assert int(metrics.get(acked_key("router-a"))) == TS - 3 and metrics.xlen(BILLING_STREAM) == 2
    pass_at(TS + 2)  # the collector back: it bills the two, and the router's held second goes in
    assert billed(chat) == (2, 1.0) and metrics.xlen(BILLING_STREAM) == 0
    assert deliver() == 1 and not delivery.held
    pass_at(TS + 7)
    assert billed(chat) == (3, 1.5)


def test_a_second_far_ahead_of_the_sinks_clock_is_refused_and_its_routers_next_are_billed(
    settings, operator_client, metrics, chat
):
    """A second more than MAX_AHEAD_S past the sink's clock would move its router's mark past the
    seconds it has yet to send, which would then read as retries and go unbilled: refused."""
    import asyncio
    import os

    from django.utils import timezone
    from redis.asyncio import Redis

    from dataplane.router.metering import publish
    from dataplane.wire.load_samples import MAX_AHEAD_S, acked_key

    rows = (TrafficSample(chat.pk, "owner", requests=1, mu=0.25),)
    # Redis: its router writes there itself; the collector bills no entry that far ahead.
    ahead, real = (RouterSecond(s, rows, "router-r") for s in (TS + MAX_AHEAD_S + 60, TS - 3))

    async def go() -> None:
        client = Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"))
        try:
            assert await publish(client, ahead, 420)
            await client.delete(acked_key("router-r"))  # Redis's own mark, for the test's sake
            assert await publish(client, real, 420)
        finally:
            await client.aclose()

    asyncio.run(go())
    pass_at(TS + 2)
    assert billed(chat) == (1, 0.25) and metrics.xlen(BILLING_STREAM) == 0
    # Posted: a 400 naming the second; the router's real seconds after it are stored and billed.
    settings.REDIS_URL = ""
    now = int(timezone.now().timestamp())

    def post(second: int):
        return operator_client.post(
            "/api/v1/load-samples/", RouterSecond(second, rows, "router-p").to_json(), format="json"
        )

    refused = post(now + MAX_AHEAD_S + 60)
    assert refused.status_code == 400 and "ahead" in refused.json()["fields"]["second"]["errors"][0]
    assert post(now - 3).status_code == 201
    assert post(now + 30).status_code == 201  # a clock a little ahead is no harm
    Lease.objects.filter(name=collector.COLLECTOR).update(last_run_at=None)
    assert tasks.collect_load().startswith("collected through")
    assert billed(chat) == (3, 0.75)
