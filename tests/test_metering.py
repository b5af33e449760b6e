"""Routers' metering in Redis becomes each endpoint's used MU/min, and the ledger's USED."""

from datetime import UTC, datetime, timedelta

import pytest

from controlplane import scaling
from controlplane.endpoints import samples
from dataplane.wire.load_samples import TrafficSample, load_key, routers_key

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
TS = int(NOW.timestamp())


def test_the_last_minute_of_router_rows_is_the_used_rate(
    publish_seconds, owner, make_endpoint, operator_client
):
    chat = make_endpoint(owner, "chat")
    # 30 requests of 0.24 MU over the last minute, published the way routers publish them (two
    # routers adding to the same second), and one row older than the window.
    seconds = {s: [[], []] for s in range(TS - 70, TS)}
    for i in range(30):
        seconds[TS - 1 - 2 * i] = [[TrafficSample(chat.pk, "owner", mu=0.12)]] * 2
    seconds[TS - 65] = [[TrafficSample(chat.pk, "owner", mu=100)], []]
    publish_seconds(seconds)
    scaling.horizontal_pass(None, NOW + timedelta(seconds=samples.LAG_S))
    chat.refresh_from_db()
    assert chat.used_mu_per_minute == pytest.approx(7.2)
    (row,) = operator_client.get("/api/v1/capacity/").json()
    # USED in GPUs is what running replicas hold (ready pods x GPUs per replica): none here.
    assert row["used_mu_per_minute"] == pytest.approx(7.2) and row["used_gpus"] == 0


def test_usage_decays_to_zero_when_traffic_stops(publish_seconds, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    chat.used_mu_per_minute = 50
    chat.save()
    publish_seconds({s: [[]] for s in range(TS - 70, TS)})  # routers up, no traffic
    scaling.horizontal_pass(None, NOW + timedelta(seconds=samples.LAG_S))
    chat.refresh_from_db()
    assert chat.used_mu_per_minute == 0


def test_the_routers_rows_outlive_the_collectors_catch_up(publish_seconds, metrics, owner, make_endpoint):
    """The rows routers publish (with their default TTL) live longer than the collector's
    catch-up reaches back, so a beat stopped for up to MAX_CATCH_UP_S finds, and bills, every
    second. At the routers' old 120 s, a beat stopped 2 to 6 minutes lost those seconds."""
    chat = make_endpoint(owner, "chat")
    publish_seconds({TS - 1: [[TrafficSample(chat.pk, "owner", requests=1, mu=0.5)]]})
    for key in (load_key(chat.pk, TS - 1), routers_key(TS - 1)):
        assert metrics.ttl(key) > samples.MAX_CATCH_UP_S + samples.LAG_S
