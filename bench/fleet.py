"""The benchmarks' fleet at a given size, loaded with PostgreSQL's COPY, and what the benches share.

A size is its endpoints (FleetSize.of): the base fleet is 10,000 endpoints across 500 tenants
with 100,000 events, the large one 100,000 endpoints, 5,000 tenants and 1,000,000 events; both
have 20 pools (two GPU types, 8-GPU nodes) sized so their endpoints commit about 70 % of the
GPUs, but for a few pools left nearly full (FULL_POOL_FREE_GPUS free): a sale there runs into
a refusal. Beside them it loads what the pages read: the endpoints' reservations (half of
them), a ready pod per endpoint that commits a replica (its minimum or its sale), ROLLOUTS
rollouts in progress (each with its new version's pod), usage (UsageHour: every endpoint with a
pod has the last 24 hours, one in ten of them the whole last 7 days; the API's default window
and the console's day view), an hour of 5-second load buckets (LoadBucket, what the endpoint
page charts) for one endpoint in a hundred, on-call events in incidents of a few repeats folded
into their groups as EventGroup.fold would (a group quiet for ONCALL_RESOLVE_AFTER_S resolved),
48 hours of per-minute capacity snapshots per pool, and one API key per tenant. The benches load
each size into their own PostgreSQL database (BENCH_DATABASE_URL, default controlplane_bench on
127.0.0.1), dropped and made anew per size; `load` itself writes into whatever database Django
is connected to.
"""

import argparse
import importlib.util
import json
import math
import os
import random
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DB_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/controlplane_bench")
# A migrated database on the same server that a new bench database copies (CREATE DATABASE ...
# TEMPLATE), the migrations then a no-op: the smoke tests' (tests/test_bench_smoke.py), made once.
TEMPLATE = os.environ.get("BENCH_TEMPLATE_DATABASE", "")

GPUS_PER_NODE = 8
COMMITTED_SHARE = 0.70  # of a pool's GPUs, what its endpoints commit (the pools but the full ones)
FULL_POOLS = 4  # pools left nearly full, two per GPU type: where the API bench sells
FULL_POOL_FREE_GPUS = 64  # GPUs a full pool has beyond its commitments (8 nodes), whatever the size
ROLLOUTS = 20
SNAPSHOT_HOURS = 48  # per-minute capacity snapshots of every pool: 57,600 rows
USAGE_DAY_HOURS = 24  # every endpoint with a pod
USAGE_WEEK_SHARE = 10  # one in ten of those: the whole week
LOAD_SAMPLE_SHARE = 100  # one endpoint in a hundred has the last hour of load buckets
EVENTS_PER_INCIDENT = 5  # mean repeats of one problem, minutes apart: what folds into a group


@dataclass(frozen=True)
class FleetSize:
    endpoints: int
    tenants: int
    events: int
    pools: int = 20
    models: int = 10

    @classmethod
    def of(cls, endpoints: int) -> "FleetSize":
        """The base fleet's proportions at `endpoints`: 20 endpoints per tenant, 10 events each."""
        if endpoints < 1:
            raise ValueError(f"a fleet has at least one endpoint, not {endpoints}")
        return cls(endpoints, max(1, endpoints // 20), endpoints * 10)

    @property
    def label(self) -> str:
        """10000 -> '10k', 50 -> '50': the rows' prefix."""
        return f"{self.endpoints // 1000}k" if self.endpoints % 1000 == 0 else str(self.endpoints)

    def describe(self) -> str:
        return (
            f"{self.endpoints:,} endpoints, {self.tenants:,} tenants, {self.events:,} events,"
            f" {self.pools} pools"
        )


BASE, LARGE = FleetSize.of(10_000), FleetSize.of(100_000)


@dataclass
class Fleet:
    """What a bench needs of the loaded fleet."""

    size: FleetSize
    operator_key: str
    tenant_keys: list[str]
    full_pool_ids: list[int]
    load_sampled: list[int]  # endpoints with an hour of load buckets
    counts: dict[str, int] = field(default_factory=dict)  # rows per table loaded
    committed_share: float = 0.0  # committed GPUs / GPUs, the pools but the full ones
    timings: dict[str, float] = field(default_factory=dict)  # s per step


def use_project_python() -> None:
    """Re-run this script with the project's .venv/bin/python when the interpreter running it has
    no Django (a system `python`); without a .venv, stop with a one-line error."""
    if importlib.util.find_spec("django") is not None:
        return
    venv = ROOT / ".venv" / "bin" / "python"
    if venv.exists() and not os.environ.get("BENCH_REEXECUTED"):
        os.environ["BENCH_REEXECUTED"] = "1"  # a .venv without Django must not loop
        os.execv(str(venv), [str(venv), os.path.abspath(sys.argv[0]), *sys.argv[1:]])
    raise SystemExit(f"{Path(sys.argv[0]).name}: Django is not installed here; run `make install` first")


def recreate_database() -> None:
    import psycopg

    url = urlparse(DB_URL)
    name = url.path.lstrip("/")
    admin = url._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{TEMPLATE}"' if TEMPLATE else ""))


def setup_django() -> None:
    os.environ["DATABASE_URL"] = DB_URL
    os.environ.setdefault("DEBUG", "0")
    os.environ.setdefault("SECRET_KEY", "bench-only-not-a-secret")  # a database URL needs a key
    os.environ.setdefault("LOG_LEVEL", "WARNING")  # not a line per console sign-in
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()


def fresh_database() -> float:
    """Drop and make the bench database, migrated (quietly); returns the seconds it took."""
    started = time.monotonic()
    setup_django()
    from django.contrib.contenttypes.models import ContentType
    from django.core.management import call_command
    from django.db import connections

    connections.close_all()  # the drop forces them closed anyway; Django must not reuse them
    recreate_database()
    ContentType.objects.clear_cache()
    call_command("migrate", verbosity=0)
    return time.monotonic() - started


def vacuum() -> float:
    """VACUUM ANALYZE the bench database, as a live one is after autovacuum: COPY leaves the
    visibility map unset (index-only scans visit the heap) and the planner without statistics."""
    import psycopg

    started = time.monotonic()
    with psycopg.connect(DB_URL, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
    return time.monotonic() - started


def load_fresh(size: FleetSize) -> Fleet:
    """A fresh database with the fleet of `size` in it, vacuumed; Django connected to it."""
    started = time.monotonic()
    migrate_s = fresh_database()
    fleet = load(size)
    fleet.timings = {"migrate": migrate_s, **fleet.timings, "vacuum": vacuum()}
    fleet.timings["total"] = time.monotonic() - started
    return fleet


# --- loading -------------------------------------------------------------------------------------


def copy_rows(model: Any, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
    """COPY `rows` (values of `columns`, attnames, in that order) into `model`'s table; every
    other column takes its field's default (one value for all rows: a `timezone.now` default is
    the time of the call), a nullable one without a default NULL, an omitted primary key the
    table's identity. A column that is NOT NULL with no default is refused, by name: a field
    added to a model cannot leave the loader writing rows the product would not."""
    from django.db import connection
    from django.utils import timezone

    given = set(columns)
    tail_columns: list[str] = []
    tail: list[Any] = []
    for f in model._meta.concrete_fields:
        if f.attname in given or f.primary_key:
            continue
        if getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False):
            value: Any = f.get_db_prep_save(timezone.now(), connection)
        elif f.has_default() or (not f.null and f.empty_strings_allowed):
            value = f.get_db_prep_save(f.get_default(), connection)
        elif f.null:
            continue
        else:
            raise ValueError(
                f"{model.__name__}.{f.name} is NOT NULL without a default: the loader must set it"
            )
        tail_columns.append(f.column)
        tail.append(value)
    names = [model._meta.get_field(c).column for c in columns] + tail_columns
    quoted = ", ".join(connection.ops.quote_name(n) for n in names)
    extra = tuple(tail)
    n = 0
    with connection.cursor() as cursor:
        with cursor.copy(
            f"COPY {connection.ops.quote_name(model._meta.db_table)} ({quoted}) FROM STDIN"
        ) as copy:
            for row in rows:
                copy.write_row((*row, *extra))
                n += 1
    return n


@contextmanager
def indexes_deferred(models: Sequence[Any]) -> Iterator[None]:
    """Drop these tables' indexes (those no constraint holds: the primary keys and unique
    constraints stay) and make them again at the end: building an index once from all the
    rows is several times faster than keeping it up to date row by row under COPY."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL maintenance_work_mem = '256MB'")
        cursor.execute(
            "SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
            " WHERE x.indrelid = ANY(%s::regclass[])"
            " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)",
            [[m._meta.db_table for m in models]],
        )
        indexes = cursor.fetchall()
        for name, _ in indexes:
            cursor.execute(f"DROP INDEX {connection.ops.quote_name(name)}")
    yield
    with connection.cursor() as cursor:
        for _, definition in indexes:
            cursor.execute(definition)


class Planned(NamedTuple):
    """One endpoint as the loader plans it, before it is written."""

    id: int
    tenant_id: int
    pool_index: int
    model: int
    min_concurrency: int
    max_concurrency: int
    scale_to_zero: bool
    reserved: int  # MU/min, 0: no reservation
    pods: int  # ready pods (0 or 1)
    used_mu: float


def plan_endpoints(size: FleetSize, rng: random.Random) -> list[Planned]:
    """Endpoint i is in pool i % pools (the pool's GPU type is pool % 2); its model cycles
    through the models; a fifth scale to zero (no minimum), the others keep 1-3 replicas at 8
    concurrent requests each; half hold a reservation of 1-3 replicas' MU."""
    plans = []
    for i in range(size.endpoints):
        to_zero = rng.random() < 0.2
        low = 0 if to_zero else rng.choice([0, 8, 8, 16, 24])
        reserved = rng.choice([50, 100, 100, 200, 300]) if rng.random() < 0.5 else 0
        pods = 0 if to_zero and not reserved else 1
        plans.append(
            Planned(
                id=i + 1,
                tenant_id=i % size.tenants + 1,
                pool_index=i % size.pools,
                model=(i // size.pools) % size.models,
                min_concurrency=low,
                max_concurrency=rng.randint(max(low, 8), 256),
                scale_to_zero=to_zero,
                reserved=reserved,
                pods=pods,
                used_mu=round(rng.uniform(5, 90), 1) if pods else 0.0,
            )
        )
    return plans


def load(size: FleetSize, seed: int = 7) -> Fleet:
    """Load the fleet into the migrated, empty database Django is connected to, in one
    transaction (foreign keys unchecked while it runs: the loader writes whole tables
    consistently, and checking 1,000,000 events one by one is most of the time otherwise)."""
    from django.conf import settings
    from django.core.management.color import no_style
    from django.db import connection, transaction
    from django.utils import timezone

    from capacity.ledger import Shape
    from capacity.provisioning import replica_bounds
    from controlplane import pool_ledgers
    from controlplane.capacity.models import (
        CapacityHour,
        CapacitySnapshot,
        GpuPool,
        GpuType,
        ModelProfile,
        Reservation,
    )
    from controlplane.endpoints.models import Endpoint, LoadBucket, Pod, Rollout, UsageHour
    from controlplane.oncall.models import Event, EventGroup
    from controlplane.tenants.models import KEY_PREFIX, ApiKey, Tenant, hash_secret
    from dataplane.cluster.rollout import Phase, RolloutState

    rng = random.Random(seed)
    now = timezone.now()
    timings: dict[str, float] = {}
    counts: dict[str, int] = {}
    clock = time.monotonic()

    def step(name: str) -> None:
        nonlocal clock
        timings[name] = time.monotonic() - clock
        clock = time.monotonic()

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL session_replication_role = replica")  # no FK triggers
            cursor.execute("SET LOCAL synchronous_commit = off")
        types = GpuType.objects.bulk_create(
            [
                GpuType(name="h100-80gb", memory_gib=80, hourly_cost_usd=2.49),
                GpuType(name="l40s-48gb", memory_gib=48, hourly_cost_usd=0.99),
            ]
        )
        profiles = ModelProfile.objects.bulk_create(
            [
                ModelProfile(
                    model=f"model-{m}",
                    gpu_type=t,
                    alpha=0.001,
                    beta=0.01,
                    gamma=0.05,
                    gpus_per_replica=1 + m % 4,
                )
                for m in range(size.models)
                for t in types
            ]
        )
        profile_of = {
            (m, t): profiles[m * len(types) + t] for m in range(size.models) for t in range(len(types))
        }
        plans = plan_endpoints(size, rng)

        # Rollouts in progress: endpoints outside the full pools moving to their model from the
        # next one, at a canary of 10 %: both versions committed, a ready pod each.
        candidates = [p for p in plans if p.pool_index >= FULL_POOLS and p.pods]
        rolling = {p.id for p in rng.sample(candidates, min(ROLLOUTS, len(candidates)))}
        canary = RolloutState(Phase.CANARY, 10, now.timestamp(), canary_percent=10)

        # The pools, sized on what their endpoints commit (selling's arithmetic).
        over = pool_ledgers.overcommit()
        committed = [0] * size.pools
        desired: dict[int, int] = {}
        for p in plans:
            gpus = profile_of[(p.model, p.pool_index % 2)].gpus_per_replica
            low = replica_bounds(p.min_concurrency, p.max_concurrency, 8, p.scale_to_zero)[0]
            own = Shape(settings.MU_PER_REPLICA_MINUTE, gpus).commitment(p.reserved, low, over)
            desired[p.id] = max(own.replicas, p.pods)
            if p.id in rolling:
                old_gpus = profile_of[((p.model + 1) % size.models, p.pool_index % 2)].gpus_per_replica
                old, new = pool_ledgers.rollout_replicas(canary, own.replicas, desired[p.id])
                committed[p.pool_index] += old * old_gpus + new * gpus
            else:
                committed[p.pool_index] += own.gpus

        def gpu_count(i: int) -> int:
            want = committed[i] + FULL_POOL_FREE_GPUS if i < FULL_POOLS else committed[i] / COMMITTED_SHARE
            return max(1, math.ceil(want / GPUS_PER_NODE)) * GPUS_PER_NODE

        pools = GpuPool.objects.bulk_create(
            [
                GpuPool(
                    name=f"pool-{i}",
                    gpu_type=types[i % 2],
                    region=f"region-{i % 4}",
                    gpu_count=gpu_count(i),
                    gpus_per_node=GPUS_PER_NODE,
                )
                for i in range(size.pools)
            ]
        )
        step("pools")

        big = [Endpoint, Pod, UsageHour, LoadBucket, EventGroup, Event, CapacitySnapshot]
        with indexes_deferred(big):
            counts["tenants"] = copy_rows(
                Tenant, ["id", "name"], ((t + 1, f"tenant-{t}") for t in range(size.tenants))
            )
            operator_secret = KEY_PREFIX + secrets.token_urlsafe(32)
            tenant_secrets = [KEY_PREFIX + secrets.token_urlsafe(32) for _ in range(size.tenants)]
            counts["api keys"] = copy_rows(
                ApiKey,
                ["name", "tenant_id", "is_operator", "prefix", "secret_hash"],
                [("bench-operator", None, True, operator_secret[:9], hash_secret(operator_secret))]
                + [("bench", t + 1, False, s[:9], hash_secret(s)) for t, s in enumerate(tenant_secrets)],
            )
            name = {p.id: f"endpoint-{p.id - 1}" for p in plans}
            profile_id = {p.id: profile_of[(p.model, p.pool_index % 2)].pk for p in plans}
            counts["endpoints"] = copy_rows(
                Endpoint,
                ENDPOINT_COLUMNS,
                (
                    (
                        p.id, p.tenant_id, name[p.id], name[p.id], profile_id[p.id], pools[p.pool_index].pk,
                        p.min_concurrency, p.max_concurrency, 8, p.scale_to_zero, desired[p.id],
                        p.pods + (p.id in rolling), _state(p), p.used_mu, 2 if p.id in rolling else 1,
                        now - timedelta(days=30, seconds=p.id),
                    )
                    for p in plans
                ),
            )  # fmt: skip
            counts["reservations"] = copy_rows(
                Reservation,
                ["endpoint_id", "mu_per_minute", "sold_by"],
                ((p.id, p.reserved, "bench-operator") for p in plans if p.reserved),
            )
            Rollout.objects.bulk_create(
                [
                    Rollout(
                        endpoint_id=p.id,
                        from_version=1,
                        to_version=2,
                        from_profile=profile_of[((p.model + 1) % size.models, p.pool_index % 2)],
                        to_profile=profile_of[(p.model, p.pool_index % 2)],
                        phase=Phase.CANARY.value,
                        new_percent=10,
                        canary_percent=10,
                        phase_since=now - timedelta(minutes=5),
                        started_at=now - timedelta(minutes=15),
                    )
                    for p in plans
                    if p.id in rolling
                ]
            )
            counts["rollouts"] = len(rolling)
            counts["pods"] = copy_rows(Pod, POD_COLUMNS, _pod_rows(plans, name, rolling, now))
            step("tenants, endpoints, pods")

            counts["usage hours"] = copy_rows(UsageHour, USAGE_COLUMNS, _usage_rows(plans, name, now, rng))
            sampled = [p.id for p in plans if p.pods][::LOAD_SAMPLE_SHARE] or [plans[0].id]
            counts["load buckets"] = copy_rows(LoadBucket, BUCKET_COLUMNS, _load_rows(sampled, now, rng))
            step("usage, load buckets")

            groups, events = _incidents(size, plans, name, now, rng)
            counts["event groups"] = copy_rows(EventGroup, GROUP_COLUMNS, groups)
            counts["events"] = copy_rows(Event, EVENT_COLUMNS, events)
            step("events")

            counts["capacity snapshots"] = copy_rows(
                CapacitySnapshot, SNAPSHOT_COLUMNS, _snapshot_rows(pools, committed, now)
            )
            # their hourly rollup, as controlplane.capacity.snapshots.write keeps it beside them
            hours, snaps = CapacityHour._meta.db_table, CapacitySnapshot._meta.db_table
            with connection.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {hours} (pool_id, start, snapshots, have_mu_sum, sold_mu_sum,"
                    " used_mu_sum, used_mu_peak) SELECT pool_id,"
                    " floor(extract(epoch FROM at) / 3600)::bigint * 3600, count(*),"
                    " sum(have_mu_per_minute), sum(sold_mu_per_minute), sum(used_mu_per_minute),"
                    f" max(used_mu_per_minute) FROM {snaps} GROUP BY 1, 2"
                )
                counts["capacity hours"] = cursor.rowcount
            step("snapshots")
        step("indexes")
        with connection.cursor() as cursor:
            for sql in connection.ops.sequence_reset_sql(no_style(), [Tenant, Endpoint, EventGroup]):
                cursor.execute(sql)

    ledgers = pool_ledgers.pool_ledgers(pools)
    for pool in pools:  # the rows were copied in, not written by selling: store their ledgers
        pool_ledgers.refresh_pools([pool.pk])
    normal = [ledgers[p.pk] for p in pools[FULL_POOLS:]] or list(ledgers.values())
    share = sum(ledger.committed_gpus for ledger in normal) / max(
        1, sum(ledger.have_gpus for ledger in normal)
    )
    step("ledger check")
    oversold = [p.name for p in pools if ledgers[p.pk].oversold]
    if oversold:
        raise RuntimeError(
            f"the loader oversold pools {', '.join(oversold)}: the fleet is not one the product allows"
        )
    return Fleet(
        size=size,
        operator_key=operator_secret,
        tenant_keys=tenant_secrets,
        full_pool_ids=[p.pk for p in pools[:FULL_POOLS]],
        load_sampled=sampled,
        counts=counts,
        committed_share=share,
        timings=timings,
    )


ENDPOINT_COLUMNS = [
    "id", "tenant_id", "name", "served_model_name", "profile_id", "pool_id", "min_provisioned_concurrency",
    "max_provisioned_concurrency", "target_concurrency_per_replica", "scale_to_zero_enabled",
    "desired_replicas", "ready_replicas", "state", "used_mu_per_minute", "version", "created_at",
]  # fmt: skip
POD_COLUMNS = ["endpoint_id", "name", "url", "ready", "version", "ready_after_s", "created_at"]
USAGE_COLUMNS = [
    "endpoint_id", "endpoint_name", "tenant_id", "start", "mu", "requests", "tokens_in", "tokens_out",
    "throttled", "errors",
]  # fmt: skip
BUCKET_COLUMNS = [
    "endpoint_id", "end", "seconds", "in_flight", "queued", "mu_per_minute", "mu_squared_per_minute",
    "requests", "queue_depth", "backlog_mu", "p50_latency_s", "p99_latency_s", "latency_counts", "errors",
    "throttled", "ready_replicas", "desired_replicas",
]  # fmt: skip
SNAPSHOT_COLUMNS = [
    "pool_id", "at", "have_gpus", "sold_gpus", "used_gpus", "have_mu_per_minute", "sold_mu_per_minute",
    "used_mu_per_minute",
]  # fmt: skip


def _state(p: Planned) -> str:
    if p.pods:
        return "ready"
    return "scaled_to_zero" if p.scale_to_zero else "pending"


def _pod_rows(
    plans: list[Planned], name: dict[int, str], rolling: set[int], now: datetime
) -> Iterable[tuple[Any, ...]]:
    """A ready pod per endpoint that has one; an endpoint in a rollout has its new version's too."""
    for p in plans:
        if p.pods:
            address = f"10.{p.id >> 16 & 255}.{p.id >> 8 & 255}.{p.id & 255}"
            for v in (1, 2) if p.id in rolling else (1,):
                yield (p.id, f"{name[p.id]}-v{v}-0", f"http://{address}:{8000 + v}", True, v, 31.5,
                       now - timedelta(hours=3 - v))  # fmt: skip


def _snapshot_rows(pools: list[Any], committed: list[int], now: datetime) -> Iterable[tuple[Any, ...]]:
    """Per pool, a snapshot a minute: what it commits (as sold) and 60 % of it used, with a
    daily swing (sin of minutes / 229.2: peaks 24 h apart); 40 MU/min per GPU."""
    for pool, sold in zip(pools, committed, strict=True):
        for m in range(SNAPSHOT_HOURS * 60):
            wave = 0.8 + 0.2 * math.sin(m / 229.2)
            have, used = float(pool.gpu_count), sold * 0.6
            yield (pool.pk, now - timedelta(minutes=m), have, sold * wave, used * wave, have * 40,
                   sold * 40 * wave, used * 40 * wave)  # fmt: skip


def _usage_rows(
    plans: list[Planned], name: dict[int, str], now: datetime, rng: random.Random
) -> Iterable[tuple[Any, ...]]:
    """Every endpoint with a pod: its last 24 hours (the current one included); one in ten of
    them: the whole 7 days. MU from its metered rate, with a daily swing."""
    hour = int(now.timestamp()) // 3600 * 3600
    serving = [p for p in plans if p.pods]
    week = {p.id for p in serving[::USAGE_WEEK_SHARE]}
    for p in serving:
        for k in range(7 * 24 if p.id in week else USAGE_DAY_HOURS):
            mu = p.used_mu * 60 * (0.6 + 0.4 * math.sin((hour / 3600 - k) / 3.82)) * rng.uniform(0.8, 1.2)
            requests = int(mu / 2)
            yield (p.id, name[p.id], p.tenant_id, hour - k * 3600, round(mu, 2), requests, requests * 480,
                   requests * 150, requests // 200, requests // 1000)  # fmt: skip


def _load_rows(endpoints: list[int], now: datetime, rng: random.Random) -> Iterable[tuple[Any, ...]]:
    """An hour of 5-second buckets for each of `endpoints`, as the collector writes them."""
    from dataplane.wire.load_samples import LATENCY_BUCKETS_S

    last = int(now.timestamp()) // 5 * 5
    slots = len(LATENCY_BUCKETS_S) + 1
    for endpoint_id in endpoints:
        for k in range(720):
            requests = rng.randint(5, 40)
            counts = [0] * slots
            for _ in range(4):
                counts[rng.randrange(3, 9)] += requests // 4
            yield (endpoint_id, last - 5 * k, 5, requests * 0.4, 0.0, requests * 12.0, requests * 30.0,
                   requests, 0.0, 0.0, 0.2, 0.9, json.dumps(counts), 0, 0, 1, 1)  # fmt: skip


# Per kind: its share of incidents, its severities and its message (numbers are what varies
# between repeats: grouping.normalise folds them into one pattern).
KINDS = {
    "scale": (0.40, ["info"], "replicas {a} -> {b}: load {c}.{a} MU/min over the target"),
    "concurrency": (0.25, ["info"], "target concurrency {a} -> {b} per replica (p99 {c} ms)"),
    "restart": (0.20, ["warning"], "pod {pod} restarted (restart #{a}): Error, exit code 137"),
    "hang": (
        0.10,
        ["warning"] * 3 + ["critical"],
        "probe unanswered for {c}.{a} s (deadline 20 s), pod {pod}",
    ),
    "crash_loop": (0.05, ["critical"], "pod {pod} is crash looping: {b} restarts in 10 minutes"),
}
GROUP_COLUMNS = [
    "id", "fingerprint", "kind", "severity", "tenant_id", "endpoint_id", "endpoint_name", "pod", "pattern",
    "message", "count", "first_at", "last_at", "state", "resolved_at", "resolved_by", "paged",
]  # fmt: skip
EVENT_COLUMNS = [
    "kind", "severity", "tenant_id", "endpoint_id", "endpoint_name", "pod", "version", "group_id", "message",
    "detail", "time", "recorded_at", "reported_by",
]  # fmt: skip


@dataclass
class _Group:
    """An EventGroup as the loader folds events into it (GROUP_COLUMNS, in order)."""

    id: int
    fingerprint: str
    kind: str
    severity: str
    tenant_id: int
    endpoint_id: int
    endpoint_name: str
    pod: str
    pattern: str
    message: str
    count: int
    first_at: datetime
    last_at: datetime
    state: str = "open"
    resolved_at: datetime | None = None
    resolved_by: str = ""
    paged: str = ""  # a critical one has paged: "firing", then "resolved" once resolved

    def resolve(self, quiet: timedelta) -> None:
        self.state, self.resolved_at, self.resolved_by = "resolved", self.last_at + quiet, "auto: no repeat"
        if self.paged == "firing":
            self.paged = "resolved"

    def row(self) -> tuple[Any, ...]:
        return tuple(getattr(self, c) for c in GROUP_COLUMNS)


def _incidents(
    size: FleetSize, plans: list[Planned], name: dict[int, str], now: datetime, rng: random.Random
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Events in incidents over the last 7 days: one problem (kind, endpoint) repeating a few
    times minutes apart. Folded into groups the way EventGroup.fold counts them; a group quiet
    for ONCALL_RESOLVE_AFTER_S is resolved then (EventGroup.resolve_quiet), as the beat does."""
    from django.conf import settings

    from controlplane.oncall import grouping

    quiet = timedelta(seconds=settings.ONCALL_RESOLVE_AFTER_S)
    kinds = list(KINDS)
    weights = [KINDS[k][0] for k in kinds]
    patterns = {
        k: grouping.normalise(KINDS[k][2].format(a=1, b=2, c=3, pod="endpoint-1-v1-0")) for k in kinds
    }
    raw: list[tuple[datetime, str, str, Planned, str]] = []
    while len(raw) < size.events:
        p = plans[rng.randrange(len(plans))]
        kind = rng.choices(kinds, weights)[0]
        severity = rng.choice(KINDS[kind][1])
        at = now - timedelta(seconds=rng.uniform(60, 7 * 86400))
        repeats = 1 + int(rng.expovariate(1 / (EVENTS_PER_INCIDENT - 1)))
        for _ in range(min(size.events - len(raw), repeats)):
            raw.append(
                (
                    min(at, now - timedelta(seconds=2)),
                    kind,
                    severity,
                    p,
                    f"{name[p.id]}-v1-{rng.randrange(3)}",
                )
            )
            at += timedelta(seconds=rng.uniform(20, 600))
    raw.sort(key=lambda r: r[0])  # ids in time order, as they arrive
    open_groups: dict[tuple[str, int], _Group] = {}
    groups: list[_Group] = []
    events = []
    for at, kind, severity, p, pod in raw:
        message = KINDS[kind][2].format(
            a=rng.randint(1, 9), b=rng.randint(10, 99), c=rng.randint(100, 999), pod=pod
        )
        group = open_groups.get((kind, p.id))
        if group is None or at - group.last_at > quiet:
            if group is not None:
                group.resolve(quiet)
            subject = grouping.subject(p.id, name[p.id], pod)
            fingerprint = grouping.fingerprint(kind, p.tenant_id, subject, patterns[kind])
            group = _Group(
                len(groups) + 1, fingerprint, kind, severity, p.tenant_id, p.id, name[p.id], pod,
                patterns[kind], message, 0, at, at, paged="firing" if severity == "critical" else "",
            )  # fmt: skip
            groups.append(group)
            open_groups[(kind, p.id)] = group
        group.count += 1
        group.last_at, group.message, group.pod = at, message, pod
        detail = json.dumps({"replicas": rng.randint(1, 8)})
        recorded = at + timedelta(milliseconds=20)
        events.append(
            (
                kind,
                severity,
                p.tenant_id,
                p.id,
                name[p.id],
                pod,
                1,
                group.id,
                message,
                detail,
                at,
                recorded,
                "bench",
            )
        )
    for group in open_groups.values():
        if now - group.last_at > quiet:
            group.resolve(quiet)
    return [g.row() for g in groups], events


# --- measuring and printing ----------------------------------------------------------------------

MIN_SAMPLES = 5  # a scenario past its time budget still gets these


class Result(NamedTuple):
    n: int
    p50: float
    p99: float


def percentiles(times_ms: list[float]) -> Result:
    times = sorted(times_ms)
    return Result(len(times), statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))])


def report(name: str, times_ms: list[float], goal_ms: float, own_goal: bool = False) -> Result:
    """One row: scenario, n, p50 and p99 in ms, met or MISSED against `goal_ms` (named at the
    row's end when `own_goal`: it is not the header's)."""
    r = percentiles(times_ms)
    verdict = "met" if r.p99 < goal_ms else "MISSED"
    note = f"  (goal p99 < {goal_ms:.0f} ms)" if own_goal else ""
    print(f"{name:<64} {r.n:>5} {r.p50:>8.2f} {r.p99:>8.2f}  {verdict}{note}", flush=True)
    return r


def header(goal_ms: float) -> None:
    print(f"\n{'scenario':<64} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}  goal p99 < {goal_ms:.0f} ms", flush=True)


def timed_runs(
    call: Callable[[], float], requests: int, budget_s: float, least: int = MIN_SAMPLES
) -> list[float]:
    """`requests` calls of `call` (each returns its latency in ms), fewer once `budget_s` has
    passed (`least` at least): a page that takes seconds at 100,000 endpoints is measured, not
    waited on for an hour."""
    times: list[float] = []
    deadline = time.monotonic() + budget_s
    while len(times) < requests and (len(times) < least or time.monotonic() < deadline):
        times.append(call())
    return times


@dataclass(frozen=True)
class Options:
    sizes: list[FleetSize]
    requests: int
    budget_s: float


# --smoke: does the bench still run end to end (tests/test_bench_smoke.py runs it), in seconds: a
# fleet of SMOKE_ENDPOINTS endpoints (enough for 2 in every full pool per seller of api_latency's
# sale), the fewest requests a scenario takes (MIN_SAMPLES) within a second's budget.
SMOKE_ENDPOINTS = 200
SMOKE = {"sizes": str(SMOKE_ENDPOINTS), "requests": MIN_SAMPLES, "budget_s": 1.0}


def parse_options(
    description: str,
    requests: int,
    extra: Callable[[argparse.ArgumentParser], Any] | None = None,
    argv: list[str] | None = None,
    smoke: dict[str, Any] | None = None,
) -> tuple[Options, argparse.Namespace]:
    """The sizes, requests and budget every bench takes, and its own arguments (`extra` adds them);
    --smoke makes SMOKE and `smoke` (the bench's own arguments') the defaults."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"tiny sizes, seconds: {SMOKE_ENDPOINTS} endpoints, {MIN_SAMPLES} requests a scenario",
    )
    parser.add_argument(
        "--sizes",
        default=f"{BASE.endpoints},{LARGE.endpoints}",
        help="endpoints of each fleet to run, comma-separated (default: %(default)s)",
    )
    parser.add_argument("--endpoints", type=int, help="run this one size only")
    parser.add_argument("--requests", type=int, default=requests, help="requests per scenario (%(default)s)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=30.0,
        help=f"seconds per scenario, past which it stops ({MIN_SAMPLES} requests at least; %(default)s)",
    )
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    if args.smoke:  # again, with the smoke sizes as the defaults (an explicit argument still wins)
        parser.set_defaults(**SMOKE, **(smoke or {}))
        args = parser.parse_args(argv)
    try:
        raw = [args.endpoints] if args.endpoints is not None else [int(s) for s in args.sizes.split(",")]
        sizes = [FleetSize.of(n) for n in raw]
    except ValueError as exc:
        parser.error(f"--sizes/--endpoints: {exc}")
    if args.requests < 1:
        parser.error(f"--requests must be at least 1, not {args.requests}")
    if args.budget_s < 0:
        parser.error(f"--budget-s must be at least 0, not {args.budget_s}")
    return Options(sizes, args.requests, args.budget_s), args


def print_loaded(fleet: Fleet) -> None:
    t = fleet.timings
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in t.items() if k != "total")
    print(f"loaded in {t['total']:.1f} s ({steps})")
    print("rows: " + ", ".join(f"{k} {v:,}" for k, v in fleet.counts.items()))
    print(
        f"committed: {fleet.committed_share:.0%} of the GPUs (the pools but the {FULL_POOLS} nearly full)",
        flush=True,
    )


def run_sizes(options: Options, measure: Callable[[Fleet], dict[str, Result]]) -> None:
    """Each size on a fresh database, one after the other, then the p99 ratio between them."""
    results: dict[FleetSize, dict[str, Result]] = {}
    for size in options.sizes:
        print(f"\n== {size.label}: {size.describe()} into {DB_URL}", flush=True)
        fleet = load_fresh(size)
        print_loaded(fleet)
        results[size] = measure(fleet)
    if len(results) > 1:
        print_ratios(results)


def print_ratios(results: dict[FleetSize, dict[str, Result]]) -> None:
    first, *others = results
    for other in others:
        print(f"\np99 ratio {other.label}/{first.label} per scenario")
        print(f"{'scenario':<64} {first.label + ' p99':>10} {other.label + ' p99':>10} {'ratio':>7}")
        for name, base in results[first].items():
            large = results[other].get(name)
            if large is not None:
                print(f"{name:<64} {base.p99:>10.2f} {large.p99:>10.2f} {large.p99 / base.p99:>6.1f}x")
