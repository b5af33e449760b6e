"""Existing endpoints keep the pods they have (endpoints 0016): each one's served name is its
name at the upgrade, the name its running pods were started with, so the first pass after the
upgrade declares the same deployments and restarts nothing."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from controlplane.endpoints.models import Endpoint


@pytest.mark.django_db(transaction=True)
def test_existing_endpoints_serve_the_name_their_pods_were_started_with():
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    before = [(app, "0014_load_mu_squared" if app == "endpoints" else name) for app, name in leaves]
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
    for name in ("chat", "support-bot"):
        old.get_model("endpoints", "Endpoint").objects.create(
            tenant=tenant, name=name, profile=profile, pool=pool,
            max_provisioned_concurrency=8, target_concurrency_per_replica=8,
        )  # fmt: skip

    MigrationExecutor(connection).migrate(leaves)

    served = dict(Endpoint.objects.values_list("name", "served_model_name"))
    assert served == {"chat": "chat", "support-bot": "support-bot"}
