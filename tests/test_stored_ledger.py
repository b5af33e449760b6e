"""The stored ledger (controlplane.pool_ledgers.refresh_ledgers) always equals a fresh computation:
after any sequence of the writes that change a pool (endpoints created, changed, moved to another
model, deleted; sales and releases; a pool's shape, a model's price; pods going ready; the
autoscaler's pass; a promote), refused ones included, and after concurrent writers on PostgreSQL.

The fresh computation is the per-endpoint one (pool_ledgers.pool_ledgers, its own queries), not the
grouped read the store is computed from; the holders are recomputed endpoint by endpoint."""

import json
import random
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.core import serializers
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import F, Max
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from capacity.ledger import AllowanceExceeded, Oversold, QuotaExceeded
from controlplane import pods, pool_ledgers, prepared, rollouts, scaling, selling
from controlplane.capacity.models import (
    GpuPool,
    ModelProfile,
    PoolMark,
    ProvisionedAllowance,
    Reservation,
    StoredLedger,
)
from controlplane.endpoints.deployments import deployment_name
from controlplane.endpoints.models import Endpoint, Pod, Rollout
from controlplane.prepared import Prepared
from controlplane.tenants.models import Tenant
from dataplane.cluster.driver import PodState

REFUSED = (Oversold, QuotaExceeded, AllowanceExceeded, ValidationError, Rollout.DoesNotExist)
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class Cluster:
    """The cluster's side of the pod sync and the pass (what the agent or Kubernetes reports)."""

    def __init__(self) -> None:
        self.pods: dict[str, PodState] = {}

    def apply(self, deployments) -> None:
        pass

    def scale(self, name, replicas) -> None:
        pass

    def set_target_concurrency(self, name, target) -> None:
        pass

    def list_pods(self) -> list[PodState]:
        return list(self.pods.values())

    def run(self, endpoint: Endpoint, ready: int) -> None:
        """`ready` ready pods of the endpoint, of each version it runs (a rollout's two)."""
        versions = {endpoint.version}
        active = Rollout.objects.active().filter(endpoint_id=endpoint.pk).first()
        if active is not None:
            versions |= {active.from_version, active.to_version}
        prefix = f"ep-{endpoint.pk}-"
        self.pods = {name: p for name, p in self.pods.items() if not name.startswith(prefix)}
        for version in versions:
            for n in range(ready):
                name = f"{deployment_name(endpoint.pk, version)}-{n}"
                self.pods[name] = PodState(
                    name, deployment_name(endpoint.pk, version), "http://127.0.0.1:1", True
                )


@dataclass
class World:
    tenants: list[Tenant]
    pools: list[GpuPool]
    profiles: list[ModelProfile]
    cluster: Cluster


@pytest.fixture
def world(h100) -> World:
    tenants = [Tenant.objects.create(name=f"t{i}", gpu_quota=64) for i in range(2)]
    pools = [
        GpuPool.objects.create(name="eight", gpu_type=h100, region="r", gpu_count=16, gpus_per_node=8),
        GpuPool.objects.create(name="four", gpu_type=h100, region="r", gpu_count=12, gpus_per_node=4),
    ]
    profiles = [
        ModelProfile.objects.create(
            model=f"tp{g}",
            gpu_type=h100,
            alpha=0,
            beta=0,
            gamma=1,
            gpus_per_replica=g,
            mu_per_replica_minute=mu,
        )
        for g, mu in [(1, 100), (2, 150), (5, 400)]
    ]
    for t in tenants:
        for p in pools:
            ProvisionedAllowance.objects.create(tenant=t, pool=p, gpus=12)
    pool_ledgers.stored_ledgers(pools)  # made without selling.save_pool: stored at their first read
    return World(tenants, pools, profiles, Cluster())


def fresh_holders(pool: GpuPool) -> list[list[int]]:
    """Every endpoint of the pool as [id, committed GPUs, committed MU/min, running GPUs],
    counted one by one (endpoint_commitments, each ready pod on its version's model)."""
    rows = []
    for e in Endpoint.objects.with_related().filter(pool=pool):
        reservation = getattr(e, "reservation", None)
        rollout = Rollout.objects.active().select_related("from_profile").filter(endpoint=e).first()
        versions = selling.endpoint_commitments(
            e, reservation.mu_per_minute if reservation else 0, pool_ledgers.running_rollout(e)
        )
        running = sum(
            rollout.from_profile.gpus_per_replica
            if rollout is not None and pod.version == rollout.from_version
            else e.profile.gpus_per_replica
            for pod in Pod.objects.filter(endpoint=e, ready=True)
        )
        committed = [v.commitment for v in versions]
        rows.append([e.pk, sum(c.gpus for c in committed), sum(c.mu_per_minute for c in committed), running])
    return pool_ledgers.holding_most(rows)[: pool_ledgers.TOP_HOLDERS]


def assert_stored_is_fresh(pools: list[GpuPool]) -> None:
    pools = list(GpuPool.objects.filter(pk__in=[p.pk for p in pools]))
    fresh = pool_ledgers.pool_ledgers(pools)
    stored = {s.pool_id: s for s in StoredLedger.objects.filter(pool__in=pools)}
    for pool in pools:
        assert stored[pool.pk].figures == fresh[pool.pk].figures(), pool.name
        assert stored[pool.pk].holders == fresh_holders(pool), pool.name
    assert_unmarked_groups_are_fresh(pools)


def counted_groups(groups) -> list[tuple[str, int]]:
    """Stored groups as what a sale relies on: each group's key and its endpoints."""
    return sorted((repr(list(group[1:])), sums[0]) for group, sums in groups)


def assert_unmarked_groups_are_fresh(pools: list[GpuPool]) -> None:
    """What a sale takes the stored groups on (PostgreSQL): a pool with no PoolMark and its
    stored digest the live one has stored groups that count each of its endpoints from what it
    is counted from now."""
    if connection.vendor != "postgresql":
        return
    for pool in pools:
        stored = StoredLedger.objects.get(pool=pool)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {pool_ledgers.digest_sql('%s')}", [pool.pk])
            (live,) = cursor.fetchone()
        if stored.groups is None or stored.digest != live or PoolMark.objects.filter(pool=pool).exists():
            continue
        fresh = pool_ledgers._storable(pool_ledgers.alike_groups(pool))
        assert counted_groups(stored.groups) == counted_groups(fresh), pool.name


def endpoint_at(i: int) -> Endpoint | None:
    endpoints = list(Endpoint.objects.select_related("profile", "pool").order_by("pk"))
    return endpoints[i % len(endpoints)] if endpoints else None


def next_id() -> int:
    """Past every endpoint's id: a name made of it is free, after deletes too."""
    return (Endpoint.objects.aggregate(Max("pk"))["pk__max"] or 0) + 1


def apply(world: World, op: tuple, now: datetime) -> str:
    """One write, as the API, the console, an operator or the passes make it; refused ones too.
    Says which it was (for hypothesis's statistics)."""
    kind, a, b, c = op
    e = endpoint_at(a)
    try:
        if kind == "create":
            selling.save_endpoint(
                Endpoint(
                    tenant=world.tenants[a % 2], name=f"e{next_id()}-{b}-{c}",
                    profile=world.profiles[b % 3], pool=world.pools[c % 2],
                    min_provisioned_concurrency=8 * (c % 3), max_provisioned_concurrency=32,
                    target_concurrency_per_replica=8,
                )
            )  # fmt: skip
        elif e is None:
            return "nothing"
        elif kind == "minimum":
            e.min_provisioned_concurrency = 8 * (b % 4)
            selling.save_endpoint(e, ["min_provisioned_concurrency"])
        elif kind == "sell":
            selling.sell(e, mu_per_minute=50 * (1 + b % 8), best_effort_allowed=True, sold_by="ops")
        elif kind == "release":
            if (r := Reservation.objects.filter(endpoint=e).first()) is not None:
                selling.release(r, released_by="ops")
        elif kind == "delete":
            selling.delete_endpoint(e, release_by="ops")
        elif kind == "model":  # another model on the same GPU type: a rollout (a canary when b is odd)
            e.profile = world.profiles[b % 3]
            e.canary_percent = 50 * (b % 2)
            selling.save_endpoint(e, ["profile"])
        elif kind == "promote":
            rollouts.command(e, "promote")
        elif kind == "pods":
            world.cluster.run(e, b % 3)
            pods.sync_pods(world.cluster)
        elif kind == "pass":  # used MU, desired replicas and rollouts' steps
            scaling.horizontal_pass(world.cluster, now)
        elif kind == "shape":
            pool = GpuPool.objects.get(pk=world.pools[b % 2].pk)
            pool.gpu_count = pool.gpus_per_node * (1 + c % 4)
            selling.save_pool(pool)
        elif kind == "price":
            profile = ModelProfile.objects.get(pk=world.profiles[b % 3].pk)
            profile.mu_per_replica_minute = 50 * (1 + c % 4)
            selling.save_profile(profile)
    except REFUSED as refusal:
        return f"{kind} refused ({type(refusal).__name__})"
    return kind


KINDS = [
    "create", "minimum", "sell", "sell", "release", "delete", "model", "model", "promote", "pods", "pods",
    "pass", "shape", "price",
]  # fmt: skip
OPS = st.tuples(st.sampled_from(KINDS), st.integers(0, 7), st.integers(0, 7), st.integers(0, 7))


@pytest.fixture(params=[pool_ledgers.TOP_HOLDERS, 2], ids=["ten-holders", "two-holders"])
def holders_stored(request, monkeypatch):
    """How many holders a pool stores: two, so that the few endpoints of a test's pools go
    beyond them (a sale that lowers one of them must find who passes it)."""
    monkeypatch.setattr(pool_ledgers, "TOP_HOLDERS", request.param)
    pool_ledgers.alike_sql.cache_clear()  # its SQL lists TOP_HOLDERS per group
    yield request.param
    pool_ledgers.alike_sql.cache_clear()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=1, max_size=12))
# A re-pricing of the model a rollout leaves: its pool is one where no endpoint runs it as its own.
@example(ops=[("model", 0, 1, 0), ("price", 0, 0, 0)])
def test_the_stored_ledger_equals_a_fresh_computation_after_any_writes(world, holders_stored, ops):
    with transaction.atomic():
        # two endpoints to start from, one in each pool, so that most writes have one to change
        for step, op in enumerate([("create", 0, 0, 1), ("create", 1, 1, 2), *ops]):
            event(apply(world, op, NOW + timedelta(minutes=step)))
            assert_stored_is_fresh(world.pools)
        transaction.set_rollback(True)  # the next example starts from the same world


def test_a_refused_write_leaves_the_stored_ledger_and_its_version(world, operator_client):
    chat = Endpoint(
        tenant=world.tenants[0], name="chat", profile=world.profiles[2], pool=world.pools[0],
        min_provisioned_concurrency=0, max_provisioned_concurrency=8, target_concurrency_per_replica=8,
    )  # fmt: skip
    selling.save_endpoint(chat)
    selling.sell(chat, mu_per_minute=800, best_effort_allowed=True, sold_by="ops")  # 2 x 5 GPUs
    before = StoredLedger.objects.get(pool=world.pools[0])
    response = operator_client.patch(
        f"/api/v1/reservations/{chat.reservation.pk}/", {"mu_per_minute": 1200}, format="json"
    )
    assert response.status_code == 409  # a third 5-GPU replica: two 8-GPU nodes hold two
    after = StoredLedger.objects.get(pool=world.pools[0])
    assert (after.version, after.figures) == (before.version, before.figures)
    assert response.json()["committed_replicas"] == before.figures["committed_replicas"] == 2
    # /capacity/ reads the stored figures, with their version.
    (row,) = [r for r in operator_client.get("/api/v1/capacity/").json() if r["pool"] == "eight"]
    assert (row["version"], row["committed_gpus"], row["free_gpus"]) == (before.version, 10, 6)


def full_reads(queries) -> list[str]:
    """The statements that read a whole pool's grouped rows (alike_groups), not one endpoint's."""
    grouped = [q["sql"] for q in queries if "ready ON ready.endpoint_id" in q["sql"]]
    return [sql for sql in grouped if "AND pe.id" not in sql]


def test_sales_take_the_stored_groups_and_leave_them_as_a_read_of_the_pool_would(world):
    """On PostgreSQL a sale reads its endpoint's row and whether its pool is marked, not the
    pool's grouped rows, as long as no write without the pool's lock came between; every sale
    leaves the stored groups as a read of the pool would, and no mark."""
    if connection.vendor != "postgresql":
        pytest.skip("marks: PostgreSQL triggers")
    pool = world.pools[0]
    chat, batch = (
        Endpoint(
            tenant=world.tenants[0], name=name, profile=world.profiles[0], pool=pool,
            min_provisioned_concurrency=0, max_provisioned_concurrency=8, target_concurrency_per_replica=8,
        )
        for name in ("chat", "batch")
    )  # fmt: skip
    selling.save_endpoint(chat)
    selling.save_endpoint(batch)
    for endpoint, mu in [(chat, 100), (batch, 300), (chat, 500), (chat, 200)]:  # new, raised, lowered
        with CaptureQueriesContext(connection) as queries:
            selling.sell(endpoint, mu_per_minute=mu, best_effort_allowed=True, sold_by="ops")
        assert not full_reads(queries.captured_queries), mu
        stored = StoredLedger.objects.get(pool=pool)
        pool_ledgers.refresh_pools([pool.pk])
        fresh = StoredLedger.objects.get(pool=pool)
        assert sorted(map(repr, stored.groups)) == sorted(map(repr, fresh.groups))  # in any order
        assert not PoolMark.objects.exists()
    # A write without the lock (the autoscaler's target) marks the pool: the pool is read, once.
    Endpoint.objects.filter(pk=batch.pk).update(target_concurrency_per_replica=4)
    assert PoolMark.objects.filter(pool=pool).count() == 1
    for mu in (300, 400):
        with CaptureQueriesContext(connection) as queries:
            selling.sell(chat, mu_per_minute=mu, best_effort_allowed=True, sold_by="ops")
        assert len(full_reads(queries.captured_queries)) == (mu == 300)
    assert not PoolMark.objects.exists()
    assert_stored_is_fresh([pool])
    # The groups are JSON text in the database; Django's dumpdata and loaddata read them as JSON.
    stored = StoredLedger.objects.get(pool=pool)
    with connection.cursor() as cursor:
        cursor.execute("SELECT groups FROM capacity_storedledger WHERE pool_id = %s", [pool.pk])
        assert json.loads(cursor.fetchone()[0]) == stored.groups
    dumped = serializers.serialize("json", [stored])
    assert json.loads(dumped)[0]["fields"]["groups"] == stored.groups
    (loaded,) = serializers.deserialize("json", dumped)
    assert loaded.object.groups == stored.groups


def test_a_sales_own_row_is_prepared_once_per_connection_and_kept_through_rollbacks(world):
    """On PostgreSQL the statement a sale reads its endpoint's row with (selling.own_row) is
    prepared once on its connection, then only executed: a refused sale (its savepoint rolled
    back) and a transaction rolled back keep it, where psycopg's own prepared statements are
    all deallocated at any rollback. One gone (DEALLOCATE ALL), planned for a column type
    since changed (a migration), or held by the session unrecorded is prepared anew, the sale
    made all the same."""
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements: PostgreSQL")
    pool = world.pools[0]
    endpoint = Endpoint(
        tenant=world.tenants[0], name="chat", profile=world.profiles[0], pool=pool,
        min_provisioned_concurrency=0, max_provisioned_concurrency=8, target_concurrency_per_replica=8,
    )  # fmt: skip
    selling.save_endpoint(endpoint)
    name = selling.own_row().name

    def sale(mu: int) -> list[str]:
        """The sale's PREPARE, EXECUTE and DEALLOCATE of the prepared one; refused or not."""
        with CaptureQueriesContext(connection) as queries:
            try:
                selling.sell(endpoint, mu_per_minute=mu, best_effort_allowed=True, sold_by="ops")
            except Oversold:
                pass
        verbs = [q["sql"].split()[0] for q in queries.captured_queries if name in q["sql"]]
        return [v for v in verbs if v in ("PREPARE", "EXECUTE", "DEALLOCATE")]

    def sql(statement: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(statement)

    sql("DEALLOCATE ALL")  # an earlier test may have prepared it on this connection
    prepared._PREPARED.pop(connection.connection, None)  # its record lost, not the statement
    assert sale(100) == ["PREPARE", "EXECUTE"]
    assert sale(10**9) == ["EXECUTE"]  # refused: its savepoint rolled back
    with transaction.atomic():
        assert sale(200) == ["EXECUTE"]
        transaction.set_rollback(True)
    assert sale(300) == ["EXECUTE"]
    sql("DEALLOCATE ALL")
    assert sale(400) == ["EXECUTE", "PREPARE", "EXECUTE"]
    sql("SET CONSTRAINTS ALL IMMEDIATE")  # the test's pending foreign key checks, before the ALTER
    sql("ALTER TABLE capacity_modelprofile ALTER COLUMN model TYPE varchar(300)")  # undone with the test
    assert sale(500) == ["EXECUTE", "DEALLOCATE", "PREPARE", "EXECUTE"]
    prepared._PREPARED.pop(connection.connection, None)  # its record lost, not the statement
    assert sale(600) == ["DEALLOCATE", "PREPARE", "EXECUTE"]
    with override_settings(DATABASE_PREPARED_STATEMENTS=False):  # behind PgBouncer: planned each time
        assert sale(700) == []
    assert Reservation.objects.get(endpoint=endpoint).mu_per_minute == 700
    assert_stored_is_fresh([pool])


def test_a_prepared_statement_numbers_each_named_parameter_once():
    prepared = Prepared.of("SELECT %(a)s + %(b)s WHERE %(a)s > 0")
    assert prepared.prepare.endswith(" AS SELECT $1 + $2 WHERE $1 > 0")
    assert prepared.execute == f"EXECUTE {prepared.name}(%(a)s, %(b)s)"
    assert Prepared.of("SELECT %(a)s + 1").name != prepared.name
    for bad in ("SELECT %s", "SELECT 'x' LIKE '%%'"):
        with pytest.raises(ValueError, match="%\\(name\\)s parameters only"):
            Prepared.of(bad)


@pytest.mark.parametrize("holders_stored", [2], indirect=True)
def test_a_holder_lowered_below_one_not_stored_is_passed_by_it(world, holders_stored):
    """Two holders stored of three endpoints: the first sold down below the third, which was
    not stored, ranks after it (the sale reads the pool's holders)."""
    pool = world.pools[0]
    first, second, third = (
        Endpoint(
            tenant=world.tenants[0], name=name, profile=world.profiles[0], pool=pool,
            min_provisioned_concurrency=0, max_provisioned_concurrency=8, target_concurrency_per_replica=8,
        )
        for name in ("first", "second", "third")
    )  # fmt: skip
    for endpoint, mu in [(first, 600), (second, 400), (third, 300)]:
        selling.save_endpoint(endpoint)
        selling.sell(endpoint, mu_per_minute=mu, best_effort_allowed=True, sold_by="ops")
    assert [h[0] for h in StoredLedger.objects.get(pool=pool).holders] == [first.pk, second.pk]
    selling.sell(first, mu_per_minute=100, best_effort_allowed=True, sold_by="ops")
    assert [h[0] for h in StoredLedger.objects.get(pool=pool).holders] == [second.pk, third.pk]
    assert_stored_is_fresh(world.pools)


def batch_and_chat(world: World) -> tuple[Endpoint, Endpoint]:
    """In pool "eight" (two nodes of 8 GPUs: two 5-GPU replicas), two endpoints of the 5-GPU
    model, saved: batch commits one replica (its minimum at a target of 8), chat none."""
    batch, chat = (
        Endpoint(
            tenant=world.tenants[0], name=name, profile=world.profiles[2], pool=world.pools[0],
            min_provisioned_concurrency=low, max_provisioned_concurrency=8, target_concurrency_per_replica=8,
            scale_to_zero_enabled=True,
        )
        for name, low in [("batch", 4), ("chat", 0)]
    )  # fmt: skip
    selling.save_endpoint(batch)
    selling.save_endpoint(chat)
    return batch, chat


def test_a_sale_after_a_write_without_the_pools_lock_is_checked_against_the_pool_as_it_is(world):
    """The autoscaler writes an endpoint's target without the pool's lock held to its refresh,
    which follows its commit: a sale in between must not take the stored groups, which count
    the endpoint as it was (the pool is marked), but the pool as it is."""
    pool = world.pools[0]
    batch, chat = batch_and_chat(world)
    Endpoint.objects.filter(pk=batch.pk).update(target_concurrency_per_replica=2)  # two, unstored
    assert StoredLedger.objects.get(pool=pool).figures["committed_replicas"] == 1
    with pytest.raises(Oversold):  # the stored groups would have placed it beside one
        selling.sell(chat, mu_per_minute=400, best_effort_allowed=True, sold_by="ops")
    pool_ledgers.refresh_pools([pool.pk])
    assert StoredLedger.objects.get(pool=pool).figures["committed_replicas"] == 2
    assert not Reservation.objects.filter(endpoint=chat).exists()


# Writes in SQL, as no code of ours makes them (%(e)s the endpoint, in pool "eight", with a
# rollout from tp1 to tp2 in progress; %(profile)s profile tp5, %(pool)s pool "four"): the pools
# each marks (PoolMark, from an endpoint's row), and whether the next sale in "eight" reads it
# whole (marked, or its digest changed: a profile, any, or a rollout of the pool).
EP, RO, PROFILE = "UPDATE endpoints_endpoint SET", "endpoints_rollout", "UPDATE capacity_modelprofile SET"
WRITES = {
    "target": (f"{EP} target_concurrency_per_replica = 2 WHERE id = %(e)s", ["eight"], 1),
    "minimum": (f"{EP} min_provisioned_concurrency = 16 WHERE id = %(e)s", ["eight"], 1),
    "scale to zero": (f"{EP} scale_to_zero_enabled = true WHERE id = %(e)s", ["eight"], 1),
    "desired replicas": (f"{EP} desired_replicas = 5 WHERE id = %(e)s", ["eight"], 1),
    "model": (f"{EP} profile_id = %(profile)s WHERE id = %(e)s", ["eight"], 1),
    "moved": (f"{EP} pool_id = %(pool)s WHERE id = %(e)s", ["eight", "four"], 1),
    "rollout step": (f"UPDATE {RO} SET new_percent = 50 WHERE endpoint_id = %(e)s", [], 1),
    "rollout ended": (f"DELETE FROM {RO} WHERE endpoint_id = %(e)s", [], 1),
    "old model's price": (f"{PROFILE} mu_per_replica_minute = 50 WHERE model = 'tp1'", [], 1),
    "unused model's GPUs": (f"{PROFILE} gpus_per_replica = 4 WHERE id = %(profile)s", [], 1),
    "metered MU": (f"{EP} used_mu_per_minute = 7 WHERE id = %(e)s", [], 0),
    "name": (f"{EP} name = 'renamed' WHERE id = %(e)s", [], 0),
}  # fmt: skip


@pytest.mark.parametrize("write", WRITES, ids=list(WRITES))
def test_a_write_that_changes_what_an_endpoint_is_counted_from_makes_the_next_sale_read_the_pool(
    world, write
):
    """Marks come from a trigger and the digest is read live, so a write no code of ours makes
    (SQL, the admin, a script) makes the next sale in the pools it changes read them whole, and
    one that changes nothing a replica is counted from (a name, the metered MU) does not. The
    sale then leaves the stored ledger fresh and no mark."""
    if connection.vendor != "postgresql":
        pytest.skip("marks: PostgreSQL triggers")
    chat, other = (
        Endpoint(
            tenant=world.tenants[0], name=name, profile=world.profiles[0], pool=world.pools[0],
            min_provisioned_concurrency=8, max_provisioned_concurrency=32, target_concurrency_per_replica=8,
        )
        for name in ("chat", "other")
    )  # fmt: skip
    selling.save_endpoint(chat)
    selling.save_endpoint(other)
    chat.profile = world.profiles[1]
    selling.save_endpoint(chat, ["profile"])  # a rollout from tp1 to tp2
    assert Rollout.objects.active().filter(endpoint=chat).exists()
    assert not PoolMark.objects.exists()
    sql, marked, reads = WRITES[write]
    with connection.cursor() as cursor:
        cursor.execute(sql, {"e": chat.pk, "profile": world.profiles[2].pk, "pool": world.pools[1].pk})
        assert cursor.rowcount == 1
    names = GpuPool.objects.filter(pk__in=PoolMark.objects.values("pool")).values_list("name", flat=True)
    assert sorted(names) == sorted(marked)
    with CaptureQueriesContext(connection) as queries:
        selling.sell(other, mu_per_minute=100, best_effort_allowed=True, sold_by="ops")
    assert len(full_reads(queries.captured_queries)) == reads
    assert not PoolMark.objects.filter(pool=world.pools[0]).exists()
    assert_unmarked_groups_are_fresh([world.pools[0]])
    if reads:  # what the pool holds, its metered MU too (a sale that does not read keeps them)
        assert_stored_is_fresh([world.pools[0]])


def test_a_truncate_of_the_endpoints_marks_every_pool(world):
    """A TRUNCATE passes row triggers by: its own trigger marks every pool."""
    if connection.vendor != "postgresql":
        pytest.skip("marks: PostgreSQL triggers")
    batch_and_chat(world)  # in pool "eight"; "four" has none
    assert not PoolMark.objects.exists()
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # Django's deferred foreign keys, checked
        cursor.execute("TRUNCATE endpoints_endpoint CASCADE")  # rolled back with the test
    marked = set(PoolMark.objects.values_list("pool_id", flat=True))
    assert marked == {p.pk for p in world.pools}


def test_a_transaction_marks_a_pool_once_however_many_of_its_endpoints_it_changes(world):
    """The autoscaler's pass updates many endpoints of a pool in one transaction: one mark."""
    if connection.vendor != "postgresql":
        pytest.skip("marks: PostgreSQL triggers")
    for name in ("a", "b", "c"):
        endpoint = Endpoint(
            tenant=world.tenants[0], name=name, profile=world.profiles[0], pool=world.pools[0],
            min_provisioned_concurrency=8, max_provisioned_concurrency=32, target_concurrency_per_replica=8,
        )  # fmt: skip
        selling.save_endpoint(endpoint)
    assert not PoolMark.objects.exists()
    Endpoint.objects.filter(pool=world.pools[0]).update(desired_replicas=F("desired_replicas") + 1)
    Endpoint.objects.filter(name="a").update(target_concurrency_per_replica=4)
    assert list(PoolMark.objects.values_list("pool_id", flat=True)) == [world.pools[0].pk]


@pytest.mark.django_db(transaction=True)
def test_a_write_committed_while_the_pool_is_stored_leaves_its_mark(world):
    """A write without the pool's lock, begun before a refresh and committed after it, is not in
    what the refresh read: its mark, committed after the refresh's delete, must survive it, so
    the next sale reads the pool as it is and refuses what the stored groups would place."""
    if connection.vendor != "postgresql":
        pytest.skip("marks: PostgreSQL triggers")
    pool = world.pools[0]
    batch, chat = batch_and_chat(world)
    with other_connection() as autoscaler:
        autoscaler.execute(  # two replicas, not committed yet
            "UPDATE endpoints_endpoint SET target_concurrency_per_replica = 2 WHERE id = %s", [batch.pk]
        )
        pool_ledgers.refresh_pools([pool.pk])  # reads the target as it was, one replica
        autoscaler.commit()
    assert StoredLedger.objects.get(pool=pool).figures["committed_replicas"] == 1
    assert PoolMark.objects.filter(pool=pool).exists()
    with pytest.raises(Oversold):  # the stored groups would have placed it beside one
        selling.sell(chat, mu_per_minute=400, best_effort_allowed=True, sold_by="ops")
    pool_ledgers.refresh_pools([pool.pk])
    assert not PoolMark.objects.exists()
    assert StoredLedger.objects.get(pool=pool).figures["committed_replicas"] == 2


def test_a_writer_reads_the_pool_with_its_marks_deleted_and_its_digest_in_one_statement(world):
    """What a writer stores (its groups, the digest beside them) is what one snapshot saw: read
    apart, a profile changed between the two reads and changed back would leave groups counted
    at the changed value beside a digest equal to the live one, and a sale would take them. So
    the refresh and a sale that reads its pool each read it in the statement that deletes its
    marks and reads its digest, and in no other."""
    if connection.vendor != "postgresql":
        pytest.skip("marks: PostgreSQL triggers")
    batch, chat = batch_and_chat(world)
    for target, write in (
        (4, lambda: pool_ledgers.refresh_pools([world.pools[0].pk])),
        (8, lambda: selling.sell(chat, mu_per_minute=100, best_effort_allowed=True, sold_by="ops")),
    ):
        Endpoint.objects.filter(pk=batch.pk).update(target_concurrency_per_replica=target)  # a mark
        with CaptureQueriesContext(connection) as queries:
            write()
        sql = [q["sql"] for q in queries.captured_queries]
        (read,) = full_reads(queries.captured_queries)
        assert [q for q in sql if "DELETE FROM" in q and "capacity_poolmark" in q] == [read]
        assert "hashtextextended" in read
        assert not PoolMark.objects.exists()
        assert_unmarked_groups_are_fresh([world.pools[0]])


def other_connection() -> psycopg.Connection:
    """A second session on the test database: a writer whose transaction stays open."""
    db = connection.settings_dict
    return psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"])


@pytest.mark.django_db(transaction=True)
def test_a_repricing_uncommitted_while_an_endpoint_joins_the_profile_oversells_nothing(world):
    """A profile re-priced in a transaction still open while an endpoint is put on it: the
    endpoint's save stores its pool at the old price (a mark's trigger on the profile would
    have found no endpoint on it to mark). Once the price commits, the pool's digest is not
    the stored one: the next sale reads the pool and is refused where the stored groups, at
    1 GPU a replica, would have placed it."""
    if connection.vendor != "postgresql":
        pytest.skip("digests: PostgreSQL")
    pool, tp1, tp5 = world.pools[0], world.profiles[0], world.profiles[2]  # two nodes of 8 GPUs
    chat = Endpoint(
        tenant=world.tenants[0], name="chat", profile=tp5, pool=pool, min_provisioned_concurrency=0,
        max_provisioned_concurrency=8, target_concurrency_per_replica=8, scale_to_zero_enabled=True,
    )  # fmt: skip
    selling.save_endpoint(chat)
    batch = Endpoint(
        tenant=world.tenants[1], name="batch", profile=tp1, pool=pool, min_provisioned_concurrency=16,
        max_provisioned_concurrency=16, target_concurrency_per_replica=8,
    )  # fmt: skip
    with other_connection() as admin:
        admin.execute("UPDATE capacity_modelprofile SET gpus_per_replica = 5 WHERE id = %s", [tp1.pk])
        selling.save_endpoint(batch)  # two replicas of tp1 at 1 GPU: the price is not committed
        admin.commit()
    assert StoredLedger.objects.get(pool=pool).figures["committed_gpus"] == 2
    with pytest.raises(Oversold):  # two 5-GPU replicas, one a node: no room for chat's 5
        selling.sell(chat, mu_per_minute=400, best_effort_allowed=True, sold_by="ops")
    pool_ledgers.refresh_pools([pool.pk])
    assert StoredLedger.objects.get(pool=pool).figures["committed_gpus"] == 10


@pytest.mark.django_db(transaction=True)
def test_a_rollout_step_uncommitted_while_its_endpoint_moves_is_read_in_the_pool_it_moves_to(world):
    """A rollout's step (the pass, without the pool's lock) in a transaction still open while
    its endpoint moves from "eight" to "four": the move stores "four" with the rollout as it
    was (a trigger on the rollout would have marked "eight", where it saw the endpoint). Once
    the step commits, "four"'s digest is not the stored one: its next sale reads it whole."""
    if connection.vendor != "postgresql":
        pytest.skip("digests: PostgreSQL")
    eight, four = world.pools
    chat = Endpoint(
        tenant=world.tenants[0], name="chat", profile=world.profiles[0], pool=eight,
        min_provisioned_concurrency=8, max_provisioned_concurrency=32, target_concurrency_per_replica=8,
    )  # fmt: skip
    other = Endpoint(
        tenant=world.tenants[1], name="other", profile=world.profiles[0], pool=four,
        min_provisioned_concurrency=8, max_provisioned_concurrency=32, target_concurrency_per_replica=8,
    )  # fmt: skip
    selling.save_endpoint(chat)
    selling.save_endpoint(other)
    chat.profile = world.profiles[1]
    selling.save_endpoint(chat, ["profile"])  # a rollout from tp1 to tp2, no pods
    with other_connection() as rollout_pass:
        rollout_pass.execute(
            "UPDATE endpoints_rollout SET new_percent = 100 WHERE endpoint_id = %s", [chat.pk]
        )
        moved = Endpoint.objects.get(pk=chat.pk)
        moved.pool = four
        selling.save_endpoint(moved, ["pool"], by_operator=True)
        rollout_pass.commit()
    with CaptureQueriesContext(connection) as queries:
        selling.sell(other, mu_per_minute=100, best_effort_allowed=True, sold_by="ops")
    assert len(full_reads(queries.captured_queries)) == 1
    assert_stored_is_fresh([four])


@pytest.mark.django_db
def test_the_writers_that_lock_many_endpoints_lock_them_in_one_order(world):
    """The pod sync and the horizontal pass each lock many endpoints' rows in one statement;
    in opposite orders (newest first against oldest first) the two deadlocked under the
    concurrent writers below. Each takes them oldest first."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    for i in range(4):
        apply(world, ("create", i, i, i), NOW)
    with CaptureQueriesContext(connection) as queries:
        apply(world, ("pods", 1, 1, 0), NOW)
        apply(world, ("pass", 0, 0, 0), NOW)
    locking = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT")
        and 'FROM "endpoints_endpoint"' in q["sql"]
        and "FOR UPDATE" in q["sql"]
    ]
    assert len(locking) == 2, locking
    assert all('ORDER BY "endpoints_endpoint"."id" ASC' in sql for sql in locking), locking


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_on_postgresql_leave_the_stored_ledger_fresh_and_never_oversold(h100):
    """Eight writers (sales, minimums, models, pods synced, passes) at once on two pools: each
    write serialises on its pool's lock, so the last refresh read every committed write, and no
    sale oversold a pool."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    world = World.__new__(World)
    world.tenants = [Tenant.objects.create(name=f"c{i}", gpu_quota=64) for i in range(2)]
    world.pools = [
        GpuPool.objects.create(name=f"c{g}", gpu_type=h100, region="r", gpu_count=16, gpus_per_node=g)
        for g in (8, 4)
    ]
    world.profiles = [
        ModelProfile.objects.create(
            model=f"c{g}", gpu_type=h100, alpha=0, beta=0, gamma=1, gpus_per_replica=g
        )
        for g in (1, 2, 4)
    ]
    world.cluster = Cluster()
    for t in world.tenants:
        for p in world.pools:
            ProvisionedAllowance.objects.create(tenant=t, pool=p, gpus=16)
    pool_ledgers.stored_ledgers(world.pools)
    for i in range(6):
        apply(world, ("create", i, i, i), NOW)
    lock = threading.Lock()  # the pod sync's cluster is one shared object
    errors: list[BaseException] = []
    kinds = ["sell", "sell", "release", "minimum", "model", "promote", "pods", "pass", "create"]

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for step in range(12):
                op = (rng.choice(kinds), rng.randrange(8), rng.randrange(8), rng.randrange(8))
                if op[0] == "pods":
                    with lock:
                        apply(world, op, NOW)
                else:
                    apply(world, op, NOW + timedelta(minutes=seed * 20 + step))
        except BaseException as exc:  # a deadlock or any error fails the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert Reservation.objects.exists()
    assert_stored_is_fresh(world.pools)
    for stored in StoredLedger.objects.filter(pool__in=world.pools):
        assert stored.figures["unplaced_replicas"] == 0
