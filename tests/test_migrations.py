"""A database made by an earlier release upgrades: the capacity app moved from the top-level
`capacity` package to `controlplane.capacity` keeping its label, so its tables and the
migrations recorded in django_migrations are the same; the models match the migrations."""

import io

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from controlplane.capacity.models import GpuPool, Reservation
from controlplane.endpoints.models import DeletedEndpoint, Endpoint, UsageHour
from controlplane.selling import delete_endpoint
from tests.migrating import back_to_endpoints, endpoint_world

# The last migration of each app in the release before the move: what an existing database has
# recorded. The capacity app's names are those of the old top-level app.
BEFORE_THE_MOVE = [
    ("capacity", "0003_profile_fits_and_benchmark_scheduling"),
    ("endpoints", "0007_load_minutes"),
    ("oncall", "0003_attention_indexes"),
    ("tenants", "0002_console_members"),
]


def test_the_models_match_the_migrations(db):
    out = io.StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)  # exits non-zero on a change
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_a_database_of_the_release_before_the_move_upgrades_with_its_rows():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE_THE_MOVE)
    old = MigrationExecutor(connection).loader.project_state(BEFORE_THE_MOVE).apps
    gpu = old.get_model("capacity", "GpuType").objects.create(name="h100", memory_gib=80, hourly_cost_usd=2)
    pool = old.get_model("capacity", "GpuPool").objects.create(
        name="use1", gpu_type=gpu, region="us-east-1", gpu_count=8
    )
    profile = old.get_model("capacity", "ModelProfile").objects.create(
        model="llama-8b", gpu_type=gpu, alpha=0.0004, beta=0.004, gamma=0.02
    )
    tenant = old.get_model("tenants", "Tenant").objects.create(name="acme")
    endpoint = old.get_model("endpoints", "Endpoint").objects.create(
        tenant=tenant,
        name="chat",
        profile=profile,
        pool=pool,
        max_provisioned_concurrency=8,
        target_concurrency_per_replica=8,
        autoscaler={"tick_s": 2.0, "target_utilisation": 0.6},
    )
    old.get_model("capacity", "Reservation").objects.create(endpoint=endpoint, mu_per_minute=300)

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    assert MigrationExecutor(connection).migration_plan(executor.loader.graph.leaf_nodes()) == []
    assert GpuPool._meta.db_table == "capacity_gpupool"
    assert GpuPool.objects.get().name == "use1"
    assert Reservation.objects.get().mu_per_minute == 300
    # The per-endpoint cadence is refused now; a stored one is dropped, the rest kept.
    assert Endpoint.objects.get(pk=endpoint.pk).autoscaler == {"target_utilisation": 0.6}


@pytest.mark.django_db(transaction=True)
def test_usage_hours_of_the_release_before_keep_their_endpoint_once_it_is_deleted():
    old, leaves = back_to_endpoints("0014_load_mu_squared")
    endpoint = old.get_model("endpoints", "Endpoint").objects.create(
        **endpoint_world(old), name="chat", max_provisioned_concurrency=8, target_concurrency_per_replica=8
    )
    old.get_model("endpoints", "UsageHour").objects.create(endpoint=endpoint, start=3600, mu=2.5, requests=7)

    MigrationExecutor(connection).migrate(leaves)

    hour = UsageHour.objects.get()
    kept = (hour.endpoint_id, hour.endpoint_name, hour.tenant.name, hour.requests)
    assert kept == (endpoint.pk, "chat", "acme", 7)
    delete_endpoint(Endpoint.objects.get())
    assert UsageHour.objects.get().requests == 7  # no longer a cascade
    assert DeletedEndpoint.objects.get().endpoint_id == endpoint.pk
