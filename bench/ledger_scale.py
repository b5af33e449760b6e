"""The packed ledger at fleet scale: 1,000 nodes x 8 GPUs, 5,000 endpoints of mixed TP sizes.

    .venv/bin/python bench/ledger_scale.py [--pools 10] [--runs 20] [--smoke]

Loads the fleet in bulk into its own PostgreSQL database (LEDGER_BENCH_DATABASE_URL, default
cp_ledger_bench on 127.0.0.1), created at the start and dropped at the end, then times:
- the ledger of every pool (controlplane.pool_ledgers.pool_ledgers: the queries and the packing of
  every pool's committed replicas onto its nodes), goal < 200 ms;
- a sale check (selling.sell inside a transaction that is rolled back: the tenant's and the
  pool's locks, the pool's ledger, capacity.ledger.check_change), goal < 20 ms, on a sale that
  fits and on one that is refused (the refusal also searches how many replicas would fit).
The fleet: 250 tenants; each endpoint's model has 1, 2, 4 or 8 GPUs per replica (60/25/10/5 %);
half keep 1 minimum replica (running: one ready pod each), half scale to zero; 30 % hold a
reservation of 50-200 MU/min, so about three quarters of the GPUs are committed. Prints the
figures and the query counts; asserts nothing (this machine is shared and noisy). --smoke: the
same on SMOKE_FLEET (40 nodes, 200 endpoints: as many a node, 2 pools) with 3 runs, in seconds.
"""

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DB_URL = os.environ.get("LEDGER_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cp_ledger_bench")
TEMPLATE = os.environ.get("BENCH_TEMPLATE_DATABASE", "")  # a migrated database to copy (bench/fleet.py)
NODES, GPUS_PER_NODE, ENDPOINTS, TENANTS = 1000, 8, 5000, 250
TP_SIZES = [(1, 60), (2, 25), (4, 10), (8, 5)]  # GPUs per replica, % of endpoints
SMOKE_FLEET = (40, 200, 10)  # --smoke's NODES, ENDPOINTS, TENANTS, with 2 pools and 3 runs


def admin(sql: str) -> None:
    import psycopg

    url = urlparse(DB_URL)
    with psycopg.connect(url._replace(path="/postgres").geturl(), autocommit=True) as conn:
        conn.execute(sql.format(name=url.path.lstrip("/")))


def setup_django() -> None:
    os.environ["DATABASE_URL"] = DB_URL
    os.environ.setdefault("DEBUG", "0")
    os.environ.setdefault("SECRET_KEY", "bench-only-not-a-secret")  # a database URL needs a key
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()


def load(pools: int, rng: random.Random) -> None:
    from django.core.management import call_command

    from controlplane.capacity.models import GpuPool, GpuType, ModelProfile, Reservation
    from controlplane.endpoints.models import Endpoint, Pod
    from controlplane.tenants.models import Tenant

    call_command("migrate", verbosity=0)
    h100 = GpuType.objects.create(name="h100-80gb", memory_gib=80, hourly_cost_usd=2.49)
    per_pool = NODES // pools
    rows = GpuPool.objects.bulk_create(
        GpuPool(name=f"pool-{i}", gpu_type=h100, region=f"region-{i % 3}", gpu_count=per_pool * GPUS_PER_NODE,
                gpus_per_node=GPUS_PER_NODE)
        for i in range(pools)
    )  # fmt: skip
    profiles = {
        tp: ModelProfile.objects.create(
            model=f"tp{tp}", gpu_type=h100, alpha=0, beta=0, gamma=1, gpus_per_replica=tp
        )
        for tp, _ in TP_SIZES
    }
    tenants = Tenant.objects.bulk_create(Tenant(name=f"tenant-{i}") for i in range(TENANTS))
    sizes = rng.choices([tp for tp, _ in TP_SIZES], weights=[w for _, w in TP_SIZES], k=ENDPOINTS)
    endpoints = Endpoint.objects.bulk_create(
        Endpoint(
            tenant=tenants[i % TENANTS], name=f"e{i}", profile=profiles[tp], pool=rows[i % pools],
            min_provisioned_concurrency=0, max_provisioned_concurrency=64, target_concurrency_per_replica=8,
            scale_to_zero_enabled=rng.random() < 0.5,
        )
        for i, tp in enumerate(sizes)
    )  # fmt: skip
    Reservation.objects.bulk_create(
        Reservation(endpoint=e, mu_per_minute=rng.choice([50, 100, 150, 200]), sold_by="bench")
        for e in endpoints
        if rng.random() < 0.3
    )
    Pod.objects.bulk_create(
        Pod(endpoint=e, name=f"{e.name}-0", url="http://127.0.0.1:9", ready=True)
        for e in endpoints
        if not e.scale_to_zero_enabled
    )


def timed(fn, runs: int) -> tuple[list[float], list[float]]:
    """Wall and CPU (this process) milliseconds per run: on a shared machine the wall time
    includes waiting for a core, which the CPU time does not (nor the database's own time)."""
    wall, cpu = [], []
    for _ in range(runs):
        started, started_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
    return wall, cpu


def line(name: str, wall: list[float], cpu: list[float], goal_ms: float | None, queries: int) -> None:
    p50, worst, p50_cpu = statistics.median(wall), max(wall), statistics.median(cpu)
    p99 = statistics.quantiles(wall, n=100, method="inclusive")[98]
    goal = "" if goal_ms is None else f"  < {goal_ms:.0f} ms: {'met' if p50 < goal_ms else 'MISSED'}"
    print(
        f"{name:<62} {len(wall):>4} {p50:>8.1f} {p99:>8.1f} {worst:>8.1f} {p50_cpu:>8.1f} {queries:>7}{goal}"
    )


def measure(runs: int) -> None:
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from capacity.ledger import Oversold
    from controlplane import pool_ledgers, selling
    from controlplane.capacity.models import GpuPool
    from controlplane.endpoints.models import Endpoint

    pools = list(GpuPool.objects.select_related("gpu_type"))
    ledgers = pool_ledgers.pool_ledgers(pools)  # warm: connection, imports
    totals = [sum(getattr(ledger, f) for ledger in ledgers.values())
              for f in ("have_gpus", "committed_gpus", "committed_replicas", "sold_replicas", "free_gpus",
                        "stranded_gpus", "unplaced_replicas")]  # fmt: skip
    print(
        f"fleet: {len(pools)} pools, {NODES} nodes x {GPUS_PER_NODE} GPUs = {totals[0]} GPUs;"
        f" {Endpoint.objects.count()} endpoints; committed {totals[1]} GPUs ({totals[2]} replicas,"
        f" {totals[3]} sold); free {totals[4]}, stranded {totals[5]}, unplaced {totals[6]}"
    )
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    columns = f"{'runs':>4} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'cpu p50':>8} {'queries':>7}"
    print(f"\n{'figure':<62} {columns}  goal (wall p50)")
    with CaptureQueriesContext(connection) as ctx:
        pool_ledgers.pool_ledgers(GpuPool.objects.select_related("gpu_type"))
    wall, cpu = timed(lambda: pool_ledgers.pool_ledgers(GpuPool.objects.select_related("gpu_type")), runs)
    line("ledger of every pool (pool_ledgers)", wall, cpu, 200, len(ctx.captured_queries))

    unreserved = list(
        Endpoint.objects.with_related().filter(reservation__isnull=True, profile__gpus_per_replica=1)[:runs]
    )
    wide = list(
        Endpoint.objects.with_related().filter(reservation__isnull=True, profile__gpus_per_replica=8)[:runs]
    )

    def sale(endpoints: list, mu_per_minute: int, whole: bool) -> tuple[list[float], list[float], int, int]:
        """The sale check (selling.check_sale: the locks, the pool's read and the check, what
        decides 201 or 409), or with `whole` the whole sale (also its reservation row and its event, with
        the event's on-call group), rolled back either way: nothing stays."""
        wall, cpu, refused, queries = [], [], 0, 0
        for e in endpoints:

            def check(e=e) -> None:
                nonlocal refused
                try:
                    with transaction.atomic():
                        if whole:
                            selling.sell(
                                e, mu_per_minute=mu_per_minute, best_effort_allowed=True, sold_by="bench"
                            )
                        else:
                            selling.check_sale(e, mu_per_minute)
                        transaction.set_rollback(True)
                except Oversold:
                    refused += 1

            with CaptureQueriesContext(connection) as ctx:
                one_wall, one_cpu = timed(check, 1)
            wall += one_wall
            cpu += one_cpu
            queries = len(ctx.captured_queries)
        return wall, cpu, refused, queries

    for whole in (False, True):
        what = "whole sale, rolled back" if whole else "sale check"
        goal = None if whole else 20
        wall, cpu, refused, queries = sale(unreserved, 100, whole)
        line(f"{what}, 1 replica of 1 GPU ({refused} refused)", wall, cpu, goal, queries)
        wall, cpu, refused, queries = sale(wide, 10_000, whole)
        line(f"{what}, 100 replicas of 8 GPUs ({refused} refused)", wall, cpu, goal, queries)


def main() -> None:
    global NODES, ENDPOINTS, TENANTS
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pools", type=int, default=10, help="the 1,000 nodes split into this many pools")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: 40 nodes, 200 endpoints")
    args = parser.parse_args()
    if args.smoke:  # again, with these as the defaults (an explicit argument still wins)
        NODES, ENDPOINTS, TENANTS = SMOKE_FLEET
        parser.set_defaults(pools=2, runs=3)
        args = parser.parse_args()
    if NODES % args.pools:
        raise SystemExit(f"--pools must divide {NODES}")
    admin('DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin('CREATE DATABASE "{name}"' + (f' TEMPLATE "{TEMPLATE}"' if TEMPLATE else ""))
    try:
        setup_django()
        started = time.perf_counter()
        load(args.pools, random.Random(args.seed))
        print(f"loaded in {time.perf_counter() - started:.1f} s (seed {args.seed})")
        measure(args.runs)
    finally:
        from django.db import connections

        connections.close_all()
        admin('DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
