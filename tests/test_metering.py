"""Routers' metering in Redis becomes each endpoint's used MU/min, and the ledger's USED."""

import os

import pytest
import redis

from controlplane.endpoints.metering import collect_usage
from controlplane.endpoints.models import Pod

NOW = 1_800_000_000.5


@pytest.fixture
def metrics():
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"))
    yield client
    for key in client.scan_iter("mu:load:*"):
        client.delete(key)
    client.close()


def test_the_last_minute_of_router_rows_is_the_used_rate(metrics, owner, make_endpoint, operator_client):
    chat = make_endpoint(owner, "chat")
    Pod.objects.create(endpoint=chat, name="chat-0", url="http://127.0.0.1:9001", ready=True)
    # 30 requests of 0.24 MU over the last minute, written the way routers write them (two
    # routers adding to the same second), one row older than the window, and the current second.
    for i in range(30):
        metrics.hincrbyfloat(f"mu:load:{chat.pk}:{1_800_000_000 - 1 - 2 * i}", "mu", 0.12)
        metrics.hincrbyfloat(f"mu:load:{chat.pk}:{1_800_000_000 - 1 - 2 * i}", "mu", 0.12)
    metrics.hincrbyfloat(f"mu:load:{chat.pk}:{1_800_000_000 - 61}", "mu", 100)
    metrics.hincrbyfloat(f"mu:load:{chat.pk}:{1_800_000_000}", "mu", 100)
    assert collect_usage(metrics, NOW) == 1
    chat.refresh_from_db()
    assert chat.used_mu_per_minute == pytest.approx(7.2)
    (row,) = operator_client.get("/api/v1/capacity/").json()
    assert row["used_mu_per_minute"] == pytest.approx(7.2) and row["used_gpus"] == pytest.approx(0.072)


def test_usage_decays_to_zero_when_traffic_stops(metrics, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    chat.used_mu_per_minute = 50
    chat.save()
    assert collect_usage(metrics, NOW) == 1  # no pods now, but it still showed usage
    chat.refresh_from_db()
    assert chat.used_mu_per_minute == 0
    assert collect_usage(metrics, NOW) == 0  # nothing left to read
