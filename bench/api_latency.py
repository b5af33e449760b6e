"""API latency at fleet scale: 10,000 endpoints across 500 tenants, 100,000 events, PostgreSQL.

    make bench-api            (or: .venv/bin/python bench/api_latency.py [--requests N])

Loads the data set into its own database (BENCH_DATABASE_URL, default controlplane_bench on
127.0.0.1), serves it with gunicorn (2 sync workers, DEBUG off) on loopback, and times requests
from one sequential client: p50/p99 per scenario against the 50 ms goal. Prints figures; asserts
nothing (this machine is shared and noisy).
"""

import argparse
import http.client
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DB_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/controlplane_bench")
PORT = int(os.environ.get("BENCH_PORT", "18231"))
TENANTS, ENDPOINTS, POOLS, MODELS, EVENTS = 500, 10_000, 20, 10, 100_000
GOAL_MS = 50.0


def recreate_database() -> None:
    import psycopg

    url = urlparse(DB_URL)
    name = url.path.lstrip("/")
    admin = url._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def load() -> tuple[str, list[str]]:
    """Bulk-load the fleet; returns the operator key and one key per tenant."""
    os.environ["DATABASE_URL"] = DB_URL
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from capacity.models import GpuPool, GpuType, ModelProfile, Reservation
    from controlplane.endpoints.models import Endpoint
    from controlplane.oncall.models import Event
    from controlplane.tenants.models import ApiKey, Tenant

    call_command("migrate", verbosity=0)
    rng = random.Random(7)
    types = GpuType.objects.bulk_create(
        [
            GpuType(name="h100-80gb", memory_gib=80, hourly_cost_usd=2.49),
            GpuType(name="l40s-48gb", memory_gib=48, hourly_cost_usd=0.99),
        ]
    )
    pools = GpuPool.objects.bulk_create(
        [
            GpuPool(name=f"pool-{i}", gpu_type=types[i % 2], region=f"region-{i % 4}", gpu_count=1000)
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
    Event.objects.bulk_create(
        [
            Event(
                kind=rng.choice(["hang", "restart", "scale"]),
                severity=rng.choice(["info", "critical"]),
                tenant_id=e.tenant_id,
                endpoint=e,
                endpoint_name=e.name,
                message="bench",
            )
            for e in (endpoints[rng.randrange(ENDPOINTS)] for _ in range(EVENTS))
        ],
        batch_size=5000,
    )
    _, operator = ApiKey.issue(name="bench-operator", tenant=None)
    tenant_keys = [ApiKey.issue(name="bench", tenant=t)[1] for t in tenants]
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    connection.close()
    return operator, tenant_keys


def serve() -> subprocess.Popen:
    env = {
        **os.environ,
        "DATABASE_URL": DB_URL,
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECRET_KEY": "bench-only",
        "LOG_LEVEL": "WARNING",
    }
    server = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/gunicorn"),
            "controlplane.wsgi",
            "-w",
            "2",
            "-b",
            f"127.0.0.1:{PORT}",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            get("/api/schema/", "")
            return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("gunicorn did not start")


def get(path: str, key: str) -> float:
    """One request on a fresh connection; returns its latency in ms."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
    conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
    response = conn.getresponse()
    response.read()
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"GET {path} -> {response.status}")
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500, help="requests per scenario")
    args = parser.parse_args()
    print(f"loading {ENDPOINTS} endpoints, {TENANTS} tenants, {EVENTS} events into {DB_URL} ...")
    recreate_database()
    started = time.monotonic()
    operator, tenant_keys = load()
    print(f"loaded in {time.monotonic() - started:.1f} s")
    rng = random.Random(11)
    pages = ENDPOINTS // 50
    scenarios = {
        "tenant: list its endpoints (page 1)": lambda: ("/api/v1/endpoints/", rng.choice(tenant_keys)),
        "operator: list endpoints (random page of 200)": lambda: (
            f"/api/v1/endpoints/?page={rng.randint(1, pages)}",
            operator,
        ),
        "operator: endpoints filtered by gpu_type+state": lambda: (
            "/api/v1/endpoints/?gpu_type=h100-80gb&state=ready",
            operator,
        ),
        "operator: capacity summary (20 pools)": lambda: ("/api/v1/capacity/", operator),
        "operator: events, newest page": lambda: ("/api/v1/events/", operator),
    }
    server = serve()
    try:
        for make in scenarios.values():  # warm both workers' connections and caches
            for _ in range(20):
                get(*make())
        print(f"\n{'scenario':<48} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}  goal p99 < {GOAL_MS:.0f} ms")
        for name, make in scenarios.items():
            times = sorted(get(*make()) for _ in range(args.requests))
            p50 = statistics.median(times)
            p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
            verdict = "met" if p99 < GOAL_MS else "MISSED"
            print(f"{name:<48} {len(times):>5} {p50:>8.2f} {p99:>8.2f}  {verdict}")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
