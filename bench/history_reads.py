"""The capacity page's and the endpoint page's reads of the past at fleet scale, on PostgreSQL.

    .venv/bin/python bench/history_reads.py [--no-load] [--runs N] [--smoke]

Loads bench/fleet.py's fleet (20 pools, 10,000 endpoints, 500 tenants), then 30 days of per-minute
snapshots of every pool (864,000) summed into their hours as the migration does, 8 days of
usage of every endpoint (1.92 million UsageHours, their days and each tenant's hours and days
summed likewise), and a
day of one endpoint's 5-second load buckets (17,280) rolled up into minutes by the beat task.
Prints each read's EXPLAIN ANALYZE execution time and plan, and the median and worst wall time
of the function the page calls. Prints figures; asserts nothing (this machine is shared and
noisy). The reads before the rollups, measured on the same data: docs/capacity-ledger.md.
--smoke: the same reads on bench/fleet.py's smoke fleet with 2 days of snapshots, in seconds.
"""

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from fleet import BASE, SMOKE_ENDPOINTS, FleetSize, load_fresh, setup_django

SNAPSHOT_DAYS = 30
SMOKE_SNAPSHOT_DAYS = 2
USAGE_HOURS = 8 * 24


def load_history(snapshot_days: int = SNAPSHOT_DAYS) -> None:
    from django.db import connection
    from django.utils import timezone

    from controlplane.endpoints.models import Endpoint

    now = timezone.now()
    hour = int(now.timestamp()) // 3600 * 3600
    endpoint = Endpoint.objects.order_by("pk").first()
    assert endpoint is not None
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM capacity_capacitysnapshot; DELETE FROM capacity_capacityhour")
        # the fleet's own usage (a day, a week for some) and the endpoint's hour of buckets: replaced
        cursor.execute("DELETE FROM endpoints_usagehour")
        cursor.execute("DELETE FROM endpoints_loadbucket WHERE endpoint_id = %s", [endpoint.pk])
        cursor.execute(
            """INSERT INTO capacity_capacitysnapshot (pool_id, at, have_gpus, sold_gpus, used_gpus,
                   have_mu_per_minute, sold_mu_per_minute, used_mu_per_minute)
               SELECT p.id, t, 1000, 200, 100, 50000, 10000 + p.id, 5000 + 3000 * random()
               FROM capacity_gpupool p, generate_series(%s::timestamptz - %s * interval '1 day', %s,
                    interval '1 minute') t""",
            [now, snapshot_days, now],
        )
        cursor.execute(
            """INSERT INTO capacity_capacityhour (pool_id, start, snapshots, have_mu_sum, sold_mu_sum,
                   used_mu_sum, used_mu_peak)
               SELECT pool_id, extract(epoch FROM date_trunc('hour', at))::bigint, count(*),
                   sum(have_mu_per_minute), sum(sold_mu_per_minute), sum(used_mu_per_minute),
                   max(used_mu_per_minute)
               FROM capacity_capacitysnapshot GROUP BY 1, 2"""
        )
        cursor.execute(
            """INSERT INTO endpoints_usagehour (endpoint_id, endpoint_name, tenant_id, start, mu,
                   requests, tokens_in, tokens_out, throttled, errors)
               SELECT e.id, e.name, e.tenant_id, h, 1000 * random(), 100, 20000, 3000,
                   (random() < 0.1)::int, 0
               FROM endpoints_endpoint e, generate_series(%s - %s * 3600, %s, 3600) h""",
            [hour, USAGE_HOURS - 1, hour],
        )
        cursor.execute(
            """INSERT INTO endpoints_loadbucket (endpoint_id, "end", seconds, in_flight, queued,
                   mu_per_minute, mu_squared_per_minute, requests, queue_depth, backlog_mu,
                   latency_counts, errors, throttled, ready_replicas, desired_replicas)
               SELECT %s, e, 5, 4 * random(), 0, 300, 0, 50, 0, 0,
                   '[3, 10, 20, 10, 5, 2, 0, 0, 0, 0, 0, 0]'::jsonb, 0, 0, 2, 2
               FROM generate_series(%s - 86400 + 5, %s, 5) e""",
            [endpoint.pk, hour, hour],
        )
        cursor.execute(
            """INSERT INTO endpoints_tenantusagehour (tenant_id, start, mu, requests, tokens_in,
                   tokens_out, throttled, errors)
               SELECT tenant_id, start, sum(mu), sum(requests), sum(tokens_in), sum(tokens_out),
                   sum(throttled), sum(errors)
               FROM endpoints_usagehour GROUP BY 1, 2"""
        )
        cursor.execute(
            """INSERT INTO endpoints_tenantusageday (tenant_id, start, mu, requests, tokens_in,
                   tokens_out, throttled, errors)
               SELECT tenant_id, start - start % 86400, sum(mu), sum(requests), sum(tokens_in),
                   sum(tokens_out), sum(throttled), sum(errors)
               FROM endpoints_usagehour GROUP BY 1, 2"""
        )
        cursor.execute(
            """INSERT INTO endpoints_usageday (endpoint_id, endpoint_name, tenant_id, start, mu,
                   requests, tokens_in, tokens_out, throttled, errors)
               SELECT endpoint_id, max(endpoint_name), min(tenant_id), start - start % 86400, sum(mu),
                   sum(requests), sum(tokens_in), sum(tokens_out), sum(throttled), sum(errors)
               FROM endpoints_usagehour GROUP BY endpoint_id, start - start % 86400"""
        )
        cursor.execute("VACUUM ANALYZE")
    from controlplane.endpoints import collector, timeline
    from controlplane.endpoints.models import Lease

    Lease.objects.update_or_create(name=collector.COLLECTOR, defaults={"cursor": hour})
    timeline.MINUTES_PER_PASS = 24 * 60  # the day at once, not 3 minutes a beat
    timeline.roll_up(datetime.fromtimestamp(hour + 10, UTC))


def explain(name: str, sql: str, params: Any) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
        plan = [row[0] for row in cursor.fetchall()]
    execution = next(line for line in plan if line.startswith("Execution Time"))
    print(f"\n== {name}: {execution}")
    for line in plan:
        if "->" in line or not line.startswith(("Planning", "Execution")):
            print("   " + line)


def timed(name: str, call: Callable[[], Any], runs: int) -> None:
    times = []
    for _ in range(runs + 2):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    times = sorted(times[2:])  # two to warm up
    print(f"{name:<60} median {statistics.median(times):7.2f} ms  worst {times[-1]:7.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-load", action="store_true", help="read the database loaded last time")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--smoke", action="store_true", help=f"tiny sizes, seconds: {SMOKE_ENDPOINTS} endpoints, 2 runs"
    )
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(runs=2)
        args = parser.parse_args()
    if args.no_load:
        setup_django()
    else:
        started = time.monotonic()
        load_fresh(FleetSize.of(SMOKE_ENDPOINTS) if args.smoke else BASE)
        load_history(SMOKE_SNAPSHOT_DAYS if args.smoke else SNAPSHOT_DAYS)
        print(f"loaded in {time.monotonic() - started:.0f} s")

    from django.db import connection
    from django.test import RequestFactory
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from controlplane.console import history
    from controlplane.console.views.endpoints import endpoint_live_context
    from controlplane.endpoints import usage
    from controlplane.endpoints.models import Endpoint
    from controlplane.tenants.models import Tenant

    now = timezone.now()
    endpoint = Endpoint.objects.with_related().order_by("pk").first()
    tenant = Tenant.objects.get(name="tenant-7")
    assert endpoint is not None
    reads: dict[str, Callable[[], Any]] = {
        **{
            f"capacity chart {window}": (
                lambda s=seconds: history.capacity_history(now - timedelta(seconds=s), s)
            )
            for window, seconds in (("6h", 6 * 3600), ("1d", 86400), ("1w", 7 * 86400))
        },
        "hourly peaks (four weeks and a day)": lambda: history.hourly_peaks(now),
        "tenant usage (a week, every tenant)": lambda: history.tenant_usage(now),
        "usage API, a tenant's week by the day": lambda: list(
            usage.usage(usage.window("day", None, None, now.timestamp()), tenant=tenant)
        ),
        "usage API, a tenant's 31 days by the hour, first page": lambda: list(
            usage.usage(
                usage.window("hour", now.timestamp() - 31 * 86400 + 3600, None, now.timestamp()),
                tenant=tenant,
            )[:100]
        ),
        **{
            f"usage API, every tenant's {name}, count and first page": (
                lambda w=w: (rows := usage.usage(w)).count() + len(list(rows[:100]))
            )
            for name, w in (
                ("24 hours by the hour", usage.window("hour", None, None, now.timestamp())),
                ("7 days by the day", usage.window("day", None, None, now.timestamp())),
            )
        },
        **{
            f"endpoint charts {window}": (
                lambda w=window: endpoint_live_context(_request(RequestFactory(), w), endpoint)
            )
            for window in ("1h", "6h", "1d", "1w")
        },
    }
    for name, call in reads.items():
        with CaptureQueriesContext(connection) as queries:
            call()
        for i, query in enumerate(q["sql"] for q in queries):
            if "EXPLAIN" not in query and any(
                table in query
                for table in (
                    "capacitysnapshot",
                    "capacityhour",
                    "usagehour",
                    "usageday",
                    "loadbucket",
                    "timelineminute",
                )
            ):
                explain(f"{name}, query {i + 1}", query.replace("%", "%%"), None)
    print()
    for name, call in reads.items():
        timed(name, call, args.runs)


def _request(factory: Any, window: str) -> Any:
    from controlplane.tenants.models import Principal

    request = factory.get("/", {"window": window})
    request.principal = Principal(tenant=None, is_operator=True, name="bench")
    return request


if __name__ == "__main__":
    sys.exit(main())
