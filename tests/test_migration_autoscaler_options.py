"""Endpoints that stored an autoscaler option since removed keep their other overrides
(endpoints 0023): the removed keys go, the rest stays, and the endpoint is decided on its own
settings rather than on the defaults (a stored unknown key makes config_for fall back)."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from controlplane.endpoints.models import Endpoint
from controlplane.scaling import config_for


@pytest.mark.django_db(transaction=True)
def test_removed_options_leave_stored_overrides_and_the_rest_stays():
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    before = [(app, "0022_list_indexes" if app == "endpoints" else name) for app, name in leaves]
    executor.migrate(before)
    old = MigrationExecutor(connection).loader.project_state(before).apps
    gpu = old.get_model("capacity", "GpuType").objects.create(name="h100", memory_gib=80, hourly_cost_usd=2)
    pool = old.get_model("capacity", "GpuPool").objects.create(
        name="p", gpu_type=gpu, region="r", gpu_count=8, gpus_per_node=8
    )
    profile = old.get_model("capacity", "ModelProfile").objects.create(
        model="llama-8b", gpu_type=gpu, alpha=0.0004, beta=0.004, gamma=0.02
    )
    tenant = old.get_model("tenants", "Tenant").objects.create(name="acme")
    stored = {
        "chat": {"smooth_spread": 0.2, "scale_down_window_s": 120.0},
        "batch": {"drain_backlog_at_ready": True},
        "plain": {"burst_hold_cap": 2.0},
        "none": {},
    }
    for name, overrides in stored.items():
        old.get_model("endpoints", "Endpoint").objects.create(
            tenant=tenant, name=name, profile=profile, pool=pool, autoscaler=overrides,
            max_provisioned_concurrency=8, target_concurrency_per_replica=8,
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
