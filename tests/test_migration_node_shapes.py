"""Existing pools migrate to one node shape (capacity 0006): the largest node of at most 8 GPUs
that divides the pool, or one node of the whole pool when that would strand a replica already
placed there; existing endpoints get no region preference (endpoints 0011)."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from controlplane.capacity.models import GpuPool
from controlplane.endpoints.models import Endpoint

BEFORE = [
    ("capacity", "0005_reservation_protects_its_endpoint"),
    ("endpoints", "0010_endpoint_clamped_since"),
]


@pytest.mark.django_db(transaction=True)
def test_existing_pools_get_one_node_shape_that_keeps_what_is_placed():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = MigrationExecutor(connection).loader.project_state(BEFORE).apps
    gpu = old.get_model("capacity", "GpuType").objects.create(name="h100", memory_gib=80, hourly_cost_usd=2)
    pool = old.get_model("capacity", "GpuPool").objects
    for name, count in [("p16", 16), ("p12", 12), ("p10", 10), ("p4", 4), ("p13", 13), ("p13-wide", 13)]:
        pool.create(name=name, gpu_type=gpu, region="r", gpu_count=count)
    wide = old.get_model("capacity", "ModelProfile").objects.create(
        model="llama-70b", gpu_type=gpu, alpha=0.0004, beta=0.004, gamma=0.02, gpus_per_replica=4
    )
    tenant = old.get_model("tenants", "Tenant").objects.create(name="acme")
    old.get_model("endpoints", "Endpoint").objects.create(
        tenant=tenant, name="big", profile=wide, pool=pool.get(name="p13-wide"),
        max_provisioned_concurrency=8, target_concurrency_per_replica=8,
    )  # fmt: skip

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    shapes = {p.name: (p.gpus_per_node, p.node_count) for p in GpuPool.objects.all()}
    assert shapes == {
        "p16": (8, 2),
        "p12": (6, 2),
        "p10": (5, 2),
        "p4": (4, 1),
        "p13": (1, 13),  # prime: single-GPU nodes, nothing wider is placed there
        "p13-wide": (13, 1),  # a 4-GPU replica is placed there: one node, as the ledger saw it
    }
    assert Endpoint.objects.get().region_preference == ""
