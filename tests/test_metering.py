"""Routers' metering in Redis becomes each endpoint's used MU/min, and the ledger's USED."""

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.endpoints import samples, scaling

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
TS = int(NOW.timestamp())


def test_the_last_minute_of_router_rows_is_the_used_rate(metrics, owner, make_endpoint, operator_client):
    chat = make_endpoint(owner, "chat")
    # 30 requests of 0.24 MU over the last minute, written the way routers write them (two
    # routers adding to the same second), and one row older than the window.
    for s in range(TS - 70, TS):
        metrics.incrby(f"mu:routers:{s}", 2)
    for i in range(30):
        metrics.hincrbyfloat(f"mu:load:{chat.pk}:{TS - 1 - 2 * i}", "mu", 0.12)
        metrics.hincrbyfloat(f"mu:load:{chat.pk}:{TS - 1 - 2 * i}", "mu", 0.12)
    metrics.hincrbyfloat(f"mu:load:{chat.pk}:{TS - 65}", "mu", 100)
    scaling.horizontal_pass(None, NOW + timedelta(seconds=samples.LAG_S))
    chat.refresh_from_db()
    assert chat.used_mu_per_minute == pytest.approx(7.2)
    (row,) = operator_client.get("/api/v1/capacity/").json()
    assert row["used_mu_per_minute"] == pytest.approx(7.2) and row["used_gpus"] == pytest.approx(0.072)


def test_usage_decays_to_zero_when_traffic_stops(metrics, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    chat.used_mu_per_minute = 50
    chat.save()
    for s in range(TS - 70, TS):
        metrics.incr(f"mu:routers:{s}")  # routers up, no traffic
    scaling.horizontal_pass(None, NOW + timedelta(seconds=samples.LAG_S))
    chat.refresh_from_db()
    assert chat.used_mu_per_minute == 0
