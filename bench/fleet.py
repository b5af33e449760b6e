"""The benchmarks' data set: 10,000 endpoints across 500 tenants, 100,000 events, snapshots.

Loaded in bulk into its own PostgreSQL database (BENCH_DATABASE_URL, default controlplane_bench
on 127.0.0.1), which is dropped and made anew each run.
"""

import os
import random
import statistics
import sys
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DB_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/controlplane_bench")
TENANTS, ENDPOINTS, POOLS, MODELS, EVENTS = 500, 10_000, 20, 10, 100_000
SNAPSHOT_HOURS = 48  # per-minute capacity snapshots of every pool: 57,600 rows


def recreate_database() -> None:
    import psycopg

    url = urlparse(DB_URL)
    name = url.path.lstrip("/")
    admin = url._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def setup_django() -> None:
    os.environ["DATABASE_URL"] = DB_URL
    os.environ.setdefault("DEBUG", "0")
    os.environ.setdefault("SECRET_KEY", "bench-only-not-a-secret")  # a database URL needs a key
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()


def load() -> tuple[str, list[str]]:
    """Bulk-load the fleet; returns the operator's API key and one API key per tenant."""
    setup_django()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from controlplane.capacity import snapshots
    from controlplane.capacity.models import CapacitySnapshot, GpuPool, GpuType, ModelProfile, Reservation
    from controlplane.endpoints.models import Endpoint
    from controlplane.oncall.models import Event
    from controlplane.tenants.models import ApiKey, Tenant

    call_command("migrate", verbosity=0)
    rng = random.Random(7)
    now = timezone.now()
    types = GpuType.objects.bulk_create(
        [
            GpuType(name="h100-80gb", memory_gib=80, hourly_cost_usd=2.49),
            GpuType(name="l40s-48gb", memory_gib=48, hourly_cost_usd=0.99),
        ]
    )
    pools = GpuPool.objects.bulk_create(
        [
            GpuPool(
                name=f"pool-{i}",
                gpu_type=types[i % 2],
                region=f"region-{i % 4}",
                gpu_count=1000,
                gpus_per_node=8,
            )
            for i in range(POOLS)
        ]
    )
    profiles = ModelProfile.objects.bulk_create(
        [
            ModelProfile(
                model=f"model-{m}", gpu_type=t, alpha=0.001, beta=0.01, gamma=0.05, gpus_per_replica=1 + m % 4
            )
            for m in range(MODELS)
            for t in types
        ]
    )
    tenants = Tenant.objects.bulk_create([Tenant(name=f"tenant-{i}") for i in range(TENANTS)])
    endpoints = []
    for i in range(ENDPOINTS):
        profile = profiles[i % len(profiles)]
        pool = [p for p in pools if p.gpu_type_id == profile.gpu_type_id][i % (POOLS // 2)]
        endpoints.append(
            Endpoint(
                tenant=tenants[i % TENANTS],
                name=f"endpoint-{i}",
                profile=profile,
                pool=pool,
                min_provisioned_concurrency=rng.randint(0, 8),
                max_provisioned_concurrency=rng.randint(8, 256),
                target_concurrency_per_replica=8,
                state=rng.choice(["ready", "pending", "scaling"]),
            )
        )
    endpoints = Endpoint.objects.bulk_create(endpoints, batch_size=2000)
    # Half the endpoints hold 10 MU/min: at most 0.4 GPUs each, well inside 1,000-GPU pools.
    Reservation.objects.bulk_create(
        [Reservation(endpoint=e, mu_per_minute=10) for e in endpoints[::2]], batch_size=2000
    )
    kinds = ["hang", "restart", "scale", "crash_loop", "concurrency"]
    Event.objects.bulk_create(
        [
            Event(
                kind=rng.choice(kinds),
                severity=rng.choice(["info", "warning", "critical"]),
                tenant_id=e.tenant_id,
                endpoint=e,
                endpoint_name=e.name,
                pod=f"{e.name}-{rng.randrange(4)}",
                message="bench",
                time=now - timedelta(seconds=rng.randrange(7 * 86400)),
                recorded_at=now - timedelta(days=8),
                detail={"replicas": rng.randint(1, 8)},
            )
            for e in (endpoints[rng.randrange(ENDPOINTS)] for _ in range(EVENTS))
        ],
        batch_size=5000,
    )
    snapshots.write(  # with their hours, which the day's and week's charts read
        [
            CapacitySnapshot(
                pool=p,
                at=now - timedelta(minutes=m),
                have_gpus=1000,
                sold_gpus=200 + m % 50,
                used_gpus=100 + m % 70,
                have_mu_per_minute=50_000,
                sold_mu_per_minute=10_000 + m,
                used_mu_per_minute=5_000 + m,
            )
            for p in pools
            for m in range(SNAPSHOT_HOURS * 60)
        ]
    )
    _, operator = ApiKey.issue(name="bench-operator", tenant=None)
    tenant_keys = [ApiKey.issue(name="bench", tenant=t)[1] for t in tenants]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return operator, tenant_keys


def report(name: str, times_ms: list[float], goal_ms: float) -> None:
    times = sorted(times_ms)
    p50 = statistics.median(times)
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    print(f"{name:<52} {len(times):>5} {p50:>8.2f} {p99:>8.2f}  {'met' if p99 < goal_ms else 'MISSED'}")


def header(goal_ms: float) -> None:
    print(f"\n{'scenario':<52} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}  goal p99 < {goal_ms:.0f} ms")
