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
import subprocess
import time

from fleet import DB_URL, ENDPOINTS, EVENTS, ROOT, TENANTS, header, load, recreate_database, report

PORT = int(os.environ.get("BENCH_PORT", "18231"))
GOAL_MS = 50.0


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
    from django.db import connection

    connection.close()
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
        header(GOAL_MS)
        for name, make in scenarios.items():
            report(name, [get(*make()) for _ in range(args.requests)], GOAL_MS)
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
