"""Endpoints that stored an autoscaler option since removed keep their other overrides
(endpoints 0023): the removed keys go, the rest stays, and the endpoint is decided on its own
settings rather than on the defaults (a stored unknown key makes config_for fall back)."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from controlplane.autoscaler_config import config_for
from controlplane.endpoints.models import Endpoint
from tests.migrating import back_to_endpoints, endpoint_world


@pytest.mark.django_db(transaction=True)
def test_removed_options_leave_stored_overrides_and_the_rest_stays():
    old, leaves = back_to_endpoints("0022_list_indexes")
    world = endpoint_world(old)
    stored = {
        "chat": {"smooth_spread": 0.2, "scale_down_window_s": 120.0},
        "batch": {"drain_backlog_at_ready": True},
        "plain": {"burst_hold_cap": 2.0},
        "none": {},
    }
    for name, overrides in stored.items():
        old.get_model("endpoints", "Endpoint").objects.create(
            **world, name=name, autoscaler=overrides, max_provisioned_concurrency=8,
            target_concurrency_per_replica=8,
        )  # fmt: skip

    MigrationExecutor(connection).migrate(leaves)

    kept = dict(Endpoint.objects.values_list("name", "autoscaler"))
    assert kept == {
        "chat": {"scale_down_window_s": 120.0},
        "batch": {},
        "plain": {"burst_hold_cap": 2.0},
        "none": {},
    }
    assert config_for(Endpoint.objects.get(name="chat")).scale_down_window_s == 120.0
