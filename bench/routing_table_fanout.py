"""What routers polling /api/v1/routing-table/ cost the control plane: CPU per poll.

Loads ENDPOINTS endpoints (2 pods each, 500 tenants with a key each, half the endpoints
reserved) into its own PostgreSQL database (BENCH_DATABASE_URL, default cp_scale_fanout on
127.0.0.1, dropped and made anew), serves it with the production web server (the image's
gunicorn command, controlplane/gunicorn.conf.py, one worker) on a free 127.0.0.1 port, and
sends a bounded number of polls on one kept-alive connection: full 200s (no If-None-Match) and
304s (the current ETag). Twice: without Redis (the view builds the table for every poll, as
main did), and with a redis-server started here on a free 127.0.0.1 port holding the table
published once (controlplane.endpoints.routing.publish, what the beat task does every second),
whose CPU in this process is the builder's figure. The figure is the worker process's CPU time
(user + system, from /proc) per poll, not wall time, so the busy machine slows it less; with
it, what 1,000 routers polling once a second would take in web workers.

    python bench/routing_table_fanout.py                  # 1,000 and 10,000 endpoints
    SIZES=1000 POLLS_200=10 POLLS_304=100 python bench/routing_table_fanout.py
    python bench/routing_table_fanout.py --smoke          # 20 endpoints, 10 tenants, 2 + 3 polls
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DB_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cp_scale_fanout")
TEMPLATE = os.environ.get("BENCH_TEMPLATE_DATABASE", "")  # a migrated database to copy (bench/fleet.py)
TENANTS = 500
ROUTERS = 1000  # polling once a second each
# --smoke: does it still run end to end (tests/test_bench_smoke.py), in seconds, not what it gives
SMOKE_ENDPOINTS, SMOKE_TENANTS, SMOKE_POLLS = 20, 10, {"POLLS_200": "2", "POLLS_304": "3"}


def recreate_database() -> None:
    import psycopg

    url = urlparse(DB_URL)
    admin = url._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.path.lstrip("/")}" WITH (FORCE)')
        template = f' TEMPLATE "{TEMPLATE}"' if TEMPLATE else ""
        conn.execute(f'CREATE DATABASE "{url.path.lstrip("/")}"{template}')


def load(endpoints: int) -> str:
    """The fleet; returns the operator's key."""
    from django.core.management import call_command
    from django.db import connection

    from controlplane.capacity.models import GpuPool, GpuType, ModelProfile, Reservation
    from controlplane.endpoints.models import Endpoint, Pod
    from controlplane.tenants.models import ApiKey, Tenant

    call_command("migrate", verbosity=0)
    h100 = GpuType.objects.create(name="h100-80gb", memory_gib=80, hourly_cost_usd=2.49)
    pool = GpuPool.objects.create(name="pool-0", gpu_type=h100, region="region-0", gpu_count=100_000)
    profiles = ModelProfile.objects.bulk_create(
        [ModelProfile(model=f"model-{m}", gpu_type=h100, alpha=1e-3, beta=1e-2, gamma=0.1) for m in range(9)]
    )
    tenants = Tenant.objects.bulk_create([Tenant(name=f"tenant-{i}") for i in range(TENANTS)])
    eps = Endpoint.objects.bulk_create(
        [
            Endpoint(
                tenant=tenants[i % TENANTS],
                name=f"endpoint-{i}",
                profile=profiles[i % len(profiles)],
                pool=pool,
                max_provisioned_concurrency=64,
                target_concurrency_per_replica=8,
                state="ready",
            )
            for i in range(endpoints)
        ],
        batch_size=2000,
    )
    Pod.objects.bulk_create(
        [
            Pod(endpoint=e, name=f"{e.name}-{j}", url=f"http://10.0.{i % 250}.{j}:8000", ready=True)
            for i, e in enumerate(eps)
            for j in range(2)
        ],
        batch_size=5000,
    )
    reserved = [Reservation(endpoint=e, mu_per_minute=10) for e in eps[::2]]
    Reservation.objects.bulk_create(reserved, batch_size=2000)
    for t in tenants:
        ApiKey.issue(name="bench", tenant=t)
    _, operator = ApiKey.issue(name="bench-operator", tenant=None)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    connection.close()
    return operator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_redis() -> tuple[subprocess.Popen[bytes], str]:
    import redis

    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except redis.ConnectionError:
            time.sleep(0.1)
    raise SystemExit("redis-server did not start")


def serve(port: int, redis_url: str) -> tuple[subprocess.Popen[bytes], int]:
    env = {
        **os.environ,
        "DATABASE_URL": DB_URL,
        "SECRET_KEY": "bench-only-" + "k" * 40,
        "ALLOWED_HOSTS": "127.0.0.1",
        "WEB_CONCURRENCY": "1",
        "PYTHONPATH": str(ROOT),
        "REDIS_URL": redis_url,
        "ROUTING_TABLE_STALE_AFTER_S": "3600",  # the copy published once stays served
    }
    env.pop("DEBUG", None)
    gunicorn = Path(sys.executable).parent / "gunicorn"
    proc = subprocess.Popen(
        [str(gunicorn), "-c", "controlplane/gunicorn.conf.py", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(os.environ.get("BENCH_LOG", os.devnull), "wb"),
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200 and kids:
                return proc, int(kids[0])
        except OSError:
            pass
        time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit("the web server did not answer /healthz within 60 s")


def polls(conn: http.client.HTTPConnection, key: str, n: int, etag: str | None) -> tuple[int, str, int]:
    """n polls; returns (status of the last, its ETag, body bytes of the last)."""
    status, tag, size = 0, "", 0
    for _ in range(n):
        headers = {"Authorization": f"Bearer {key}"}
        if etag:
            headers["If-None-Match"] = etag
        conn.request("GET", "/api/v1/routing-table/", headers=headers)
        answer = conn.getresponse()
        size = len(answer.read())
        status, tag = answer.status, answer.getheader("ETag") or ""
    return status, tag, size


def main() -> None:
    global TENANTS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, seconds: 20 endpoints, 10 tenants, 2 + 3 polls"
    )
    if parser.parse_args().smoke:  # SIZES and POLLS_* still win
        TENANTS = SMOKE_TENANTS
        os.environ.setdefault("SIZES", str(SMOKE_ENDPOINTS))
        for name, count in SMOKE_POLLS.items():
            os.environ.setdefault(name, count)
    sizes = [int(s) for s in os.environ.get("SIZES", "1000,10000").split(",")]
    os.environ["DATABASE_URL"] = DB_URL
    os.environ.setdefault("SECRET_KEY", "bench-only-" + "k" * 40)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    import redis
    from django.db import connection

    from controlplane.endpoints import routing

    print(f"load: {os.getloadavg()[0]:.1f}; one web worker (uvicorn under gunicorn), its user+system CPU")
    print("endpoints source status polls body_bytes cpu_ms_per_poll worker_cores_at_1000_polls_per_s")
    redis_proc, redis_url = start_redis()
    try:
        for endpoints in sizes:
            recreate_database()
            operator = load(endpoints)
            client = redis.Redis.from_url(redis_url)
            client.delete(routing.PUBLISHED_KEY)
            for source in ("built", "published"):
                if source == "published":
                    cpu0 = time.process_time()
                    routing.publish(client)
                    build = time.process_time() - cpu0
                    print(f"{endpoints} builder: {build * 1e3:.0f} ms CPU per publish (one a second)")
                measure(endpoints, source, operator, redis_url if source == "published" else "")
            client.close()
            connection.close()  # the next size drops this database
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)


def measure(endpoints: int, source: str, operator: str, redis_url: str) -> None:
    port = free_port()
    proc, worker = serve(port, redis_url)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        _, etag, _ = polls(conn, operator, 2, None)  # warm: connections, caches
        small = endpoints <= 1000 or source == "published"
        for status_wanted, n, tag in (
            (200, int(os.environ.get("POLLS_200", "20" if small else "5")), None),
            (304, int(os.environ.get("POLLS_304", "100" if small else "10")), etag),
        ):
            c0 = cpu_s(worker)
            status, _, size = polls(conn, operator, n, tag)
            per = (cpu_s(worker) - c0) / n
            assert status == status_wanted, f"expected {status_wanted}, got {status}"
            print(f"{endpoints} {source} {status} {n} {size} {per * 1e3:.2f} {per * ROUTERS:.2f}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)


if __name__ == "__main__":
    main()
