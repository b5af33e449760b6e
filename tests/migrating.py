"""What the migration tests share: the database taken back to an endpoints migration (every other
app at its latest), and the rows an endpoint needs there, made through that state's models."""

from typing import Any

from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def back_to_endpoints(migration: str) -> tuple[Apps, list[tuple[str, str]]]:
    """Migrate to endpoints' `migration`; its models and the latest migrations (to go on to)."""
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    before = [(app, migration if app == "endpoints" else name) for app, name in leaves]
    executor.migrate(before)
    return MigrationExecutor(connection).loader.project_state(before).apps, leaves


def endpoint_world(old: Apps) -> dict[str, Any]:
    """An H100 pool with a Llama profile and tenant acme, in `old`'s models: what an endpoint
    names (tenant, profile, pool), as create() keywords."""
    gpu = old.get_model("capacity", "GpuType").objects.create(name="h100", memory_gib=80, hourly_cost_usd=2)
    pool = old.get_model("capacity", "GpuPool").objects.create(
        name="use1", gpu_type=gpu, region="us-east-1", gpu_count=8, gpus_per_node=8
    )
    profile = old.get_model("capacity", "ModelProfile").objects.create(
        model="llama-8b", gpu_type=gpu, alpha=0.0004, beta=0.004, gamma=0.02
    )
    tenant = old.get_model("tenants", "Tenant").objects.create(name="acme")
    return {"tenant": tenant, "profile": profile, "pool": pool}
