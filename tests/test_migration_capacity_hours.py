"""A database with snapshots gets their hourly rollup (capacity 0012): each pool's hours summed
from the snapshots it has, so the week's chart and the forecast read the same figures at once."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from controlplane.capacity.models import CapacityHour

BEFORE = [("capacity", "0011_provisioned_allowances")]


@pytest.mark.django_db(transaction=True)
def test_existing_snapshots_are_summed_into_their_hours():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = MigrationExecutor(connection).loader.project_state(BEFORE).apps
    gpu = old.get_model("capacity", "GpuType").objects.create(name="h100", memory_gib=80, hourly_cost_usd=2)
    pools = [
        old.get_model("capacity", "GpuPool").objects.create(
            name=name, gpu_type=gpu, region="r", gpu_count=8, gpus_per_node=8
        )
        for name in ("a", "b")
    ]
    ten = datetime(2026, 11, 20, 10, tzinfo=UTC)
    snapshot = old.get_model("capacity", "CapacitySnapshot").objects
    for pool, minutes, used in [
        (pools[0], 0, 100.0),
        (pools[0], 30, 300.0),
        (pools[0], 59, 200.0),
        (pools[0], 60, 50.0),  # 11:00: the next hour
        (pools[1], 15, 400.0),
    ]:
        snapshot.create(
            pool=pool, at=ten + timedelta(minutes=minutes), have_gpus=8, sold_gpus=2, used_gpus=1,
            have_mu_per_minute=800, sold_mu_per_minute=used * 2, used_mu_per_minute=used,
        )  # fmt: skip

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    hours = {
        (h.pool.name, h.start): (h.snapshots, h.have_mu_sum, h.sold_mu_sum, h.used_mu_sum, h.used_mu_peak)
        for h in CapacityHour.objects.select_related("pool")
    }
    start = int(ten.timestamp())
    assert hours == {
        ("a", start): (3, 2400.0, 1200.0, 600.0, 300.0),
        ("a", start + 3600): (1, 800.0, 100.0, 50.0, 50.0),
        ("b", start): (1, 800.0, 800.0, 400.0, 400.0),
    }
