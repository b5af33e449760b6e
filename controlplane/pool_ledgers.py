"""A pool's ledger as the database has it: read, grouped, stored. `pool_ledgers` reads pools'
endpoints whole (with names, for what-ifs and the console's node maps); `alike_groups` reads
them grouped by what their replicas are counted from (alike endpoints pack as one), in one SQL
statement; `refresh_ledgers` stores what a write leaves (StoredLedger: the figures, the top
holders and the groups), under the pools' locks (`locked_pools`), and `stored_ledgers` is what
readers take. A sale (controlplane.selling) checks against the stored groups instead of reading
its pool, unless a write that does not take the pool's lock changed what an endpoint is counted
from since: its row (a PoolMark) or a profile or rollout (the stored digest no longer the live
one; docs/capacity-ledger.md, "A sale does not read its pool")."""

import functools
import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable
from fractions import Fraction
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Model
from django.utils import timezone

from capacity.ledger import (
    Allocation,
    PoolLedger,
    Shape,
    committed_demands,
    pool_ledger,
)
from capacity.packing import ReplicaDemand
from capacity.provisioning import min_replicas, replica_bounds
from controlplane.capacity.models import (
    GpuPool,
    ModelProfile,
    PoolMark,
    Reservation,
    StoredLedger,
)
from controlplane.endpoints.models import Endpoint, Pod, Rollout
from controlplane.tenants.models import Tenant
from dataplane.cluster import rollout as phases


def default_shape() -> Shape:
    return Shape(settings.MU_PER_REPLICA_MINUTE, 1)


def overcommit() -> Fraction:
    return Fraction(str(settings.CAPACITY_OVERCOMMIT))


class RunningRollout(NamedTuple):
    """What the ledger reads of an endpoint's rollout in progress (or about to start)."""

    state: phases.RolloutState
    from_version: int
    to_version: int
    from_model: str
    from_shape: Shape

    @classmethod
    def of(cls, r: Rollout) -> "RunningRollout":
        return cls(r.state, r.from_version, r.to_version, r.from_profile.model, r.from_profile.shape)


def running_rollout(endpoint: Endpoint) -> RunningRollout | None:
    """The endpoint's rollout in progress: from the prefetch of with_related() when it was
    loaded so, else read."""
    if not endpoint.pk:
        return None
    prefetched = endpoint.__dict__.get("active_rollouts")
    if prefetched is None:
        prefetched = list(
            Rollout.objects.active().select_related("from_profile").filter(endpoint_id=endpoint.pk)
        )
    return RunningRollout.of(prefetched[0]) if prefetched else None


def rollout_replicas(state: phases.RolloutState, committed: int, held: int) -> tuple[int, int]:
    """The (old, new) versions' committed replicas while a rollout runs: each its share of the
    larger of what the endpoint commits (its sale or minimum) and holds (its desired replicas),
    at least one each (dataplane.cluster.rollout.split): all that the rollout runs is committed.
    A canary of 50 % on an endpoint that commits 2 and holds 4: 2 + 2; while it starts, 4 + 2."""
    return phases.split(state, max(committed, held))


def version_key(endpoint_id: int | str, version: int) -> str:
    """A rollout's old version's name in a pool's packing (its new one's is the endpoint's)."""
    return f"{endpoint_id}-v{version}"


def endpoint_of_key(key: str) -> int:
    """The endpoint a packing's demand key names (demand_key, version_key): '12-v1' -> 12."""
    return int(key.partition("-")[0])


def _allocations(
    key: str,
    label: str,
    model: str,
    shape: Shape,
    sold: int,
    used: float,
    low: int,
    running: int,
    rollout: RunningRollout | None = None,
    held: int = 0,
    running_old: int = 0,
    endpoints: int = 1,
) -> list[Allocation]:
    """An endpoint's allocations (alike endpoints' one, `endpoints` of them): one, or while its
    rollout runs one per version, each committing rollout_replicas and holding its ready pods;
    the old version sells nothing (the reservation is the endpoint's, counted once)."""
    if rollout is None:
        return [Allocation(key, shape, model, sold, used, low, running, label, endpoints)]
    committed = shape.commitment(sold, low, overcommit()).replicas
    old, new = rollout_replicas(rollout.state, committed, held)
    return [
        Allocation(
            key, shape, model, sold, used, low, running - running_old, f"{label} v{rollout.to_version}",
            replicas=new,
        ),
        Allocation(
            version_key(key, rollout.from_version), rollout.from_shape, rollout.from_model, 0, 0.0, 0,
            running_old, f"{label} v{rollout.from_version}", replicas=old,
        ),
    ]  # fmt: skip


def pool_ledgers(pools: Iterable[GpuPool]) -> dict[int, PoolLedger]:
    """Ledgers of these pools, one query per table (endpoints, their profiles, tenants,
    reservations, rollouts in progress and ready pods), never one per endpoint: 5,000 endpoints
    read in ~100 ms where one joined and grouped query took ~300 (bench/ledger_scale.py)."""
    pools = list(pools)
    pool_ids = [p.pk for p in pools]
    rows = list(
        Endpoint.objects.filter(pool_id__in=pool_ids).values_list(
            "pk", "name", "tenant_id", "pool_id", "profile_id", "used_mu_per_minute",
            "min_provisioned_concurrency", "max_provisioned_concurrency", "target_concurrency_per_replica",
            "scale_to_zero_enabled", "desired_replicas",
        )
    )  # fmt: skip
    rollouts = {
        endpoint_id: (phases.RolloutState(phases.Phase(phase), new, 0.0, canary, promoted), old, to, profile)
        for endpoint_id, phase, new, canary, promoted, old, to, profile in Rollout.objects.active()
        .filter(endpoint__pool_id__in=pool_ids)
        .values_list(
            "endpoint_id", "phase", "new_percent", "canary_percent", "promoted", "from_version", "to_version",
            "from_profile_id",
        )
    }  # fmt: skip
    profiles = {
        pk: (model, Shape(mu, gpus))
        for pk, model, mu, gpus in ModelProfile.objects.filter(
            pk__in={r[4] for r in rows} | {r[3] for r in rollouts.values()}
        ).values_list("pk", "model", "mu_per_replica_minute", "gpus_per_replica")
    }
    tenants = dict(Tenant.objects.filter(pk__in={r[2] for r in rows}).values_list("pk", "name"))
    reserved = dict(
        Reservation.objects.filter(endpoint__pool_id__in=pool_ids).values_list("endpoint_id", "mu_per_minute")
    )
    running: dict[int, int] = defaultdict(int)
    running_old: dict[int, int] = defaultdict(int)
    for endpoint_id, version, n in (
        Pod.objects.filter(ready=True, endpoint__pool_id__in=pool_ids)
        .values_list("endpoint_id", "version")
        .annotate(n=Count("pk"))
        .order_by()
    ):
        running[endpoint_id] += n
        if endpoint_id in rollouts and version == rollouts[endpoint_id][1]:
            running_old[endpoint_id] += n
    allocations: dict[int, list[Allocation]] = defaultdict(list)
    for pk, name, tenant_id, pool_id, profile_id, used, low_c, high_c, target, to_zero, desired in rows:
        model, shape = profiles[profile_id]
        rollout = None
        if pk in rollouts:
            state, old_version, to_version, from_profile = rollouts[pk]
            rollout = RunningRollout(state, old_version, to_version, *profiles[from_profile])
        allocations[pool_id] += _allocations(
            str(pk),
            f"{tenants[tenant_id]}/{name}",
            model,
            shape,
            reserved.get(pk, 0),
            used or 0.0,
            replica_bounds(low_c, high_c, target, to_zero)[0],
            running.get(pk, 0),
            rollout,
            desired,
            running_old.get(pk, 0),
        )
    return {
        pool.pk: pool_ledger(
            pool.node_count, pool.node_shape, overcommit(), allocations[pool.pk], default_shape()
        )
        for pool in pools
    }


def locked_tenant(tenant_id: int) -> Tenant:
    """Lock the tenant's row, before any pool's: every writer of an endpoint takes the tenant
    first. FOR NO KEY UPDATE, as an UPDATE of its fields would: writers serialise on it, while a
    row that names the tenant (an event, an endpoint) checks its foreign key with a key-share
    lock, which does not wait for it. With FOR UPDATE it would: the autoscaler's pass, holding
    the endpoints it updates, checks its events' tenants when it commits, and a writer holding
    the tenant and waiting for an endpoint's pool, whose holder waits for that endpoint, closed
    the cycle."""
    return Tenant.objects.select_for_update(no_key=True).get(pk=tenant_id)


def locked_pools(pool_ids: Iterable[int]) -> list[GpuPool]:
    """Lock pool rows (in id order, so two writers never deadlock; FOR NO KEY UPDATE, as
    locked_tenant). Call inside atomic()."""
    return list(GpuPool.objects.select_for_update(no_key=True).filter(pk__in=set(pool_ids)).order_by("pk"))


# A group of alike endpoints, what their replicas are counted from (endpoints alike in these
# commit alike): (is it the changed endpoint, model, gpus_per_replica, mu_per_replica_minute,
# reservation MU/min, min and target concurrency, scale to zero: not the maximum, which commits
# nothing, so a fleet's endpoints fall in few groups), then its rollout in
# progress, None for none (its id, phase, new_percent, canary_percent, promoted, from_version,
# to_version, the old model, its gpus_per_replica and mu_per_replica_minute, the endpoint's
# desired replicas): an endpoint in a rollout is a group of its own.
Group = tuple[Any, ...]


_GROUP = 19  # the columns of a Group, then the per-group sums: Sums


# (endpoints, metered MU/min, ready pods, the old version's ready pods), then with holders the
# endpoints listed: [[id, ready pods], ...].
Sums = tuple[Any, ...]


def _table(model: type[Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


@functools.cache
def lock_sql() -> str:
    """A sale's locks: the tenant's row, then the pool's (the order of locked_tenant then
    locked_pools; FOR NO KEY UPDATE OF takes them in the order named), in one statement."""
    fields = GpuPool._meta.concrete_fields
    columns = ", ".join(f"p.{connection.ops.quote_name(str(f.column))}" for f in fields)
    return (
        f"SELECT {columns} FROM {_table(Tenant)} t, {_table(GpuPool)} p"
        " WHERE t.id = %s AND p.id = %s FOR NO KEY UPDATE OF t, p"
    )


def locked_pool(rows: list[tuple[Any, ...]], tenant_id: int, pool_id: int) -> GpuPool:
    if not rows:
        raise GpuPool.DoesNotExist(f"no pool {pool_id} (or no tenant {tenant_id}) to lock")
    return GpuPool.from_db(connection.alias, [f.attname for f in GpuPool._meta.concrete_fields], rows[0])


# A Group's columns after the first, as SQL: what an endpoint's replicas are counted from.
_KEY_SQL = (
    "m.model", "m.gpus_per_replica", "m.mu_per_replica_minute", "r.mu_per_minute",
    "e.min_provisioned_concurrency", "e.target_concurrency_per_replica", "e.scale_to_zero_enabled",
    "ro.id", "ro.phase", "ro.new_percent", "ro.canary_percent", "ro.promoted", "ro.from_version",
    "ro.to_version", "fm.model", "fm.gpus_per_replica", "fm.mu_per_replica_minute",
    "CASE WHEN ro.id IS NULL THEN 0 ELSE e.desired_replicas END",
)  # fmt: skip


# The phases of a rollout in progress, as an SQL list (the enum's values, not input).
_ACTIVE_SQL = ", ".join(f"'{p.value}'" for p in phases.Phase if p.active)


def _rows_sql(reservations: bool = True) -> str:
    """A pool's endpoints joined to what _KEY_SQL reads (filtered by the caller's WHERE)."""
    return (
        f" FROM {_table(Endpoint)} e"
        f" JOIN {_table(ModelProfile)} m ON m.id = e.profile_id"
        + (f" LEFT JOIN {_table(Reservation)} r ON r.endpoint_id = e.id" if reservations else "")
        + f" LEFT JOIN {_table(Rollout)} ro ON ro.endpoint_id = e.id AND ro.phase IN ({_ACTIVE_SQL})"
        f" LEFT JOIN {_table(ModelProfile)} fm ON fm.id = ro.from_profile_id"
    )


@functools.cache
def digest_sql(pool: str) -> str:
    """What a pool's groups are counted from beside its endpoints' rows, as an SQL expression
    ("profiles:sum/rollouts:sum", `pool` the SQL of its id; empty on SQLite, which has no hash
    and whose sales read the pool): every profile's model, GPUs and MU per replica-minute (a few
    rows) and the pool's rollouts in progress (as many as run), each row hashed to 64 bits and
    summed. Read live, not marked by triggers: the pools a profile or a rollout counts in are
    found through endpoints' rows, which a concurrent transaction may be changing unseen (an
    endpoint put on the profile, moved to another pool) while a mark's trigger reads them."""
    if connection.vendor != "postgresql":
        return "''"

    def summed(columns: str, rows: str) -> str:
        return (
            f"(SELECT count(*) || ':' || coalesce(sum(hashtextextended(concat_ws(chr(31), {columns}), 0)), 0)"
            f" {rows})"
        )

    profiles = summed(
        "m.id, m.model, m.gpus_per_replica, m.mu_per_replica_minute", f"FROM {_table(ModelProfile)} m"
    )
    rollouts = summed(
        "ro.id, ro.endpoint_id, ro.phase, ro.new_percent, ro.canary_percent, ro.promoted, ro.from_version,"
        " ro.to_version, ro.from_profile_id",
        f"FROM {_table(Rollout)} ro JOIN {_table(Endpoint)} re ON re.id = ro.endpoint_id"
        f" WHERE re.pool_id = {pool} AND ro.phase IN ({_ACTIVE_SQL})",
    )
    return f"{profiles} || '/' || {rollouts}"


@functools.cache
def alike_sql(holders: bool = False, own: bool = False, store: bool = False) -> str:
    """The pool's endpoints grouped as Group, the changed one apart, with per group (endpoints,
    metered MU summed, ready pods summed, those of a rollout's old version summed). Written
    once as SQL, not built by the ORM per call: the ready pods are counted per endpoint in a
    derived table joined to the rows (one pass over the pool's ready pods, not a count per
    endpoint), which the ORM cannot say without counting each endpoint once per pod. With
    `holders`, each group also lists its endpoints that hold the most: [id, ready pods], by
    ready pods then id (alike endpoints commit alike), TOP_HOLDERS of them (all on SQLite,
    which has no arrays: _group_holders sorts them). With `own` (PostgreSQL), only the changed
    endpoint's row, then whether the pool has a PoolMark and its digest (digest_sql), in the one
    statement (the same snapshot): what a sale reads beside the stored groups (check_sale).
    With `store` (PostgreSQL), the pool's marks deleted and its digest after each row, in the
    one statement: what a writer that stores the pool reads (groups_to_store)."""
    ready = "coalesce(ready.n, 0)"
    if not holders:
        listed = ""
    elif connection.vendor == "postgresql":
        listed = f", (array_agg(ARRAY[e.id, {ready}] ORDER BY {ready} DESC, e.id))[1:{TOP_HOLDERS}]"
    else:
        listed = f", json_group_array(json_array(e.id, {ready}))"
    only, after, cleared = "", "", ""  # the one endpoint; the columns after the sums; the CTE
    if own:
        only = " AND e.id = %(changed)s"
        after = f", EXISTS (SELECT 1 FROM {_table(PoolMark)} WHERE pool_id = %(pool)s)"
    if own or store:
        after += f", {digest_sql('%(pool)s')}"
    if store:
        cleared = f"WITH cleared AS (DELETE FROM {_table(PoolMark)} WHERE pool_id = %(pool)s) "
    return (
        f"{cleared}SELECT e.id = %(changed)s, {', '.join(_KEY_SQL)},"
        " count(*), sum(e.used_mu_per_minute), CAST(coalesce(sum(ready.n), 0) AS bigint),"
        f" CAST(coalesce(sum(old.n), 0) AS bigint){listed}{after}{_rows_sql()}"
        " LEFT JOIN (SELECT pod.endpoint_id, count(*) AS n"
        f" FROM {_table(Pod)} pod JOIN {_table(Endpoint)} pe ON pe.id = pod.endpoint_id"
        f" WHERE pod.ready AND pe.pool_id = %(pool)s{only.replace('e.id', 'pe.id')}"
        " GROUP BY pod.endpoint_id) ready ON ready.endpoint_id = e.id"
        # the old version's ready pods, from the few rollouts in progress (not a probe per pod)
        " LEFT JOIN (SELECT pod.endpoint_id, count(*) AS n"
        f" FROM {_table(Rollout)} pro JOIN {_table(Pod)} pod"
        " ON pod.endpoint_id = pro.endpoint_id AND pod.version = pro.from_version AND pod.ready"
        f" WHERE pro.phase IN ({_ACTIVE_SQL}) GROUP BY pod.endpoint_id) old"
        " ON old.endpoint_id = e.id"
        f" WHERE e.pool_id = %(pool)s{only}"
        f" GROUP BY {', '.join(str(i) for i in range(1, _GROUP + 1))}"
    )


def alike_groups(
    pool: GpuPool, changed: int | None = None, holders: bool = False
) -> dict[Group, tuple[Any, ...]]:
    """The pool's endpoints in one query grouped by what their replicas are counted from (a
    fleet's endpoints take few distinct values of those, so 500 endpoints come back as tens of
    rows), endpoint `changed` apart: per group (endpoints, their metered MU summed, their ready
    pods summed, those of a rollout's old version). Read after the pool's lock, in a statement
    of its own: a statement sees the rows committed before it starts, so the read must start
    once the lock is held."""
    with connection.cursor() as cursor:
        cursor.execute(alike_sql(holders), {"changed": changed, "pool": pool.pk})
        return _groups(cursor.fetchall())


def groups_to_store(pool: GpuPool, changed: int | None = None) -> tuple[dict[Group, Sums], str]:
    """The pool's groups as alike_groups reads them with their holders, and its digest
    (digest_sql), its marks (PoolMark) deleted: for a writer that stores what it reads, under
    the pool's lock, in its transaction. One statement, so one snapshot: the delete takes the
    marks committed before it, whose writes the read sees, and a mark committed later stays;
    the digest is that of the profiles and rollouts the groups were counted from (read apart,
    a profile changed between the two reads and changed back would leave stale groups beside
    the live digest). SQLite has no marks and no digest: its sales read the pool."""
    if connection.vendor != "postgresql":
        return alike_groups(pool, changed, holders=True), ""
    with connection.cursor() as cursor:
        cursor.execute(alike_sql(holders=True, store=True), {"changed": changed, "pool": pool.pk})
        rows = cursor.fetchall()
    return _groups([row[:-1] for row in rows]), rows[0][-1] if rows else ""


def _groups(rows: list[tuple[Any, ...]]) -> dict[Group, tuple[Any, ...]]:
    return {tuple(row[:_GROUP]): tuple(row[_GROUP:]) for row in rows}


def own_reservation(groups: dict[Group, tuple[Any, ...]]) -> int:
    """The changed endpoint's reservation (MU/min, 0 for none) as alike_groups read it."""
    return next((group[4] or 0 for group in groups if group[0]), 0)


def _group_rollout(group: Group) -> tuple[RunningRollout | None, int]:
    """A group's rollout in progress (None for none) and its endpoint's desired replicas."""
    rollout_id, phase, new, canary, promoted, old, to, model, gpus, mu, held = group[8:]
    if rollout_id is None:
        return None, 0
    state = phases.RolloutState(phases.Phase(phase), new, 0.0, canary, bool(promoted))
    return RunningRollout(state, old, to, model, Shape(mu, gpus)), held


def own_rollout(groups: dict[Group, tuple[Any, ...]]) -> tuple[RunningRollout | None, int]:
    """The changed endpoint's rollout in progress and desired replicas as alike_groups read them."""
    return next((_group_rollout(group) for group in groups if group[0]), (None, 0))


def alike_allocations(
    groups: dict[Group, tuple[Any, ...]], changed: int | None
) -> tuple[list[Allocation], list[Allocation]]:
    """The groups as the ledger counts them (pool_ledger): (the others, endpoint `changed`'s
    own). No names."""
    others: list[Allocation] = []
    own: list[Allocation] = []
    for group, sums in groups.items():
        (own if group[0] else others).extend(_counted(group, sums, changed)[0])
    return others, own


def alike_demands(groups: dict[Group, tuple[Any, ...]], changed: int | None) -> list[ReplicaDemand]:
    """The committed replicas of the groups but endpoint `changed`'s own (committed_demands of
    alike_allocations' others): what a change to it is checked beside."""
    return [d for group, sums in groups.items() if not group[0] for d in _counted(group, sums, changed)[1]]


def _counted(
    group: Group, sums: tuple[Any, ...], changed: int | None
) -> tuple[tuple[Allocation, ...], tuple[ReplicaDemand, ...]]:
    """A group's allocations and committed replicas: endpoint `changed`'s own group under its
    key (demand_key's), any other under a name of its own."""
    own = changed if group[0] else None
    return _counted_as(group, tuple(sums[:4]), own, settings.CAPACITY_OVERCOMMIT)


# Computed once per group as it stands, not per sale: a sale changes one group of its pool's
# ~200, and every sale checks all of them and stores them again. The setting, not its
# Fraction, in the key: a Fraction's hash is slow to compute, and asked 400 times a sale.
@functools.lru_cache(maxsize=16_384)
def _counted_as(
    group: Group, sums: tuple[Any, ...], changed: int | None, overcommit_setting: float
) -> tuple[tuple[Allocation, ...], tuple[ReplicaDemand, ...]]:
    # A group is listed once in a ledger: a name of its own, the same in every process.
    key = (
        str(changed)
        if group[0]
        else "alike-" + hashlib.blake2b(repr(group).encode(), digest_size=8).hexdigest()
    )
    allocations = tuple(_group_allocations(group, sums, key))
    return allocations, tuple(committed_demands(allocations, Fraction(str(overcommit_setting))))


def _group_allocations(group: Group, sums: tuple[Any, ...], key: str) -> list[Allocation]:
    """A group's allocations (one, or a rollout's two) under the packing's name `key`."""
    n, used, running, running_old = sums[:4]
    model, gpus, mu, sold, low_c, target, to_zero = group[1:8]
    rollout, held = _group_rollout(group)
    return _allocations(
        key,
        f"{n} endpoint(s) of {model}",
        model,
        Shape(mu, gpus),
        sold or 0,
        used or 0.0,
        min_replicas(low_c, target, to_zero),
        running,
        rollout,
        held,
        running_old,
        n,
    )


def grouped_ledger(
    pool: GpuPool, groups: dict[Group, tuple[Any, ...]], changed: int | None = None
) -> PoolLedger:
    """The pool's ledger from its grouped rows (alike_groups): every figure pool_ledgers gives,
    without names (alike endpoints pack as one); the endpoint read apart (`changed`, as given
    to alike_groups) under its own key, demand_key's, for a what-if on it (check_change)."""
    others, own = alike_allocations(groups, changed)
    return pool_ledger(pool.node_count, pool.node_shape, overcommit(), [*others, *own], default_shape())


# How many endpoints that hold the most each pool's stored ledger lists (the console shows ten).
TOP_HOLDERS = 10


def _group_holders(group: Group, sums: tuple[Any, ...]) -> list[list[int]]:
    """The group's listed endpoints as [id, committed GPUs, committed MU/min, running GPUs]:
    each commits what one of the group commits (both versions' while its rollout runs); a
    rollout's group is one endpoint, whose old version's pods run on the old model's GPUs."""
    listed = sums[4]
    if isinstance(listed, str):  # SQLite: every endpoint of the group, unsorted
        listed = sorted(json.loads(listed), key=lambda row: (-row[1], row[0]))[:TOP_HOLDERS]
    versions = [a.committed(overcommit()) for a in _group_allocations(group, sums, "")]
    gpus, mu = sum(c.gpus for c in versions), sum(c.mu_per_minute for c in versions)
    per_pod = group[2]
    rollout, _ = _group_rollout(group)
    out = []
    for endpoint_id, ready in listed:
        running = ready * per_pod
        if rollout is not None:
            old = sums[3]
            running = (ready - old) * per_pod + old * rollout.from_shape.gpus_per_replica
        out.append([endpoint_id, gpus, mu, running])
    return out


def holding_most(rows: Iterable[list[int]]) -> list[list[int]]:
    """Holders ([id, committed GPUs, committed MU/min, running GPUs]) most first: the larger of
    committed and running GPUs, then running, then the oldest endpoint."""
    return sorted(rows, key=_holder_rank)


def _holder_rank(h: list[int]) -> tuple[int, int, int]:
    return (-max(h[1], h[3]), -h[3], h[0])


def _storable(groups: dict[Group, Sums]) -> list[list[Any]]:
    """The groups as StoredLedger.groups keeps them: none apart (the changed endpoint's merged
    into its alike group), without the endpoints listed."""
    merged: dict[Group, list[Any]] = {}
    for group, sums in groups.items():
        into = merged.setdefault((False, *group[1:]), [0, 0.0, 0, 0])
        into[1] += sums[1] or 0.0
        for i in (0, 2, 3):
            into[i] += int(sums[i])
    return [[list(group), sums] for group, sums in merged.items()]


class StoredRow(NamedTuple):
    """What a sale reads of its pool's StoredLedger (stored_sql), JSON as the cursor gives it."""

    groups: Any
    digest: str
    holders: Any
    figures: Any


def from_stored(stored: StoredRow | None, own: list[tuple[Any, ...]]) -> dict[Group, Sums] | None:
    """The pool's groups, the changed endpoint apart, from the stored groups and the endpoint's
    own row (alike_groups' shape): the stored groups less the endpoint, then the endpoint as it
    is. None when they cannot be taken: no stored groups, or the pool marked (PoolMark) or its
    digest other than the stored one (both read with the endpoint's row), a write that did not
    hold the pool's lock (the autoscaler's targets and desired replicas, a rollout's step, an
    edit in the admin or in SQL) having changed what some endpoint is counted from since; then
    the caller reads the pool. Else the stored groups count every endpoint from what it is
    counted from now (a sale, a release, a minimum, a model or a price each store the pool's
    groups under its lock), so the check is the one a read of the pool would make. Their
    metered MU and ready pods may be as they were stored (the writers of those store the pool
    once they commit)."""
    if stored is None or not own or not stored.groups:
        return None
    (row,) = own
    group, sums, (marked, digest) = tuple(row[:_GROUP]), tuple(row[_GROUP:-2]), row[-2:]
    if marked or digest != stored.digest:
        return None
    groups: dict[Group, Sums] = {tuple(g): tuple(v) for g, v in json_column(stored.groups)}
    alike = (False, *group[1:])
    counted = groups.pop(alike, None)
    if counted is None or counted[0] < 1:  # nothing changed since stored: it is there
        return None
    if counted[0] > 1:
        groups[alike] = (
            counted[0] - 1,
            counted[1] - (sums[1] or 0.0),
            *(counted[i] - int(sums[i]) for i in (2, 3)),
        )
    groups[group] = sums
    return groups


def sale_holders(holders: list[list[int]], group: Group, sums: Sums) -> list[list[int]] | None:
    """The pool's holders once the endpoint (its own group, as sold) holds what the sale leaves
    it: the stored ones with its row replaced. None when an endpoint beyond the stored ones
    (each ranks after the last stored) may now rank before it: it was stored, ranks lower than
    it did, and no longer before the last stored other than itself (the caller reads the pool)."""
    (row,) = _group_holders(group, sums)
    before = next((h for h in holders if h[0] == row[0]), None)
    last = holders[-1] if len(holders) == TOP_HOLDERS else None  # None: every endpoint is stored
    if (
        before is not None
        and last is not None
        and _holder_rank(row) > _holder_rank(before)
        and (last is before or _holder_rank(row) > _holder_rank(last))
    ):
        return None
    return holding_most([*(h for h in holders if h[0] != row[0]), row])[:TOP_HOLDERS]


def refresh_ledgers(pools: Iterable[GpuPool], read: dict[int, "Sale"] | None = None) -> dict[int, PoolLedger]:
    """Compute these pools' ledgers from their rows as they are now and store them
    (StoredLedger), each one version on; returns them. The caller holds the pools' locks
    (locked_pools) in its transaction and has made its writes: every writer of what a ledger
    counts refreshes its pools so, under their locks, so the last to commit read every write
    committed before it (and its own), and the stored ledger is the pool's as committed.
    Writers that hold rows the selling writers wait for (the autoscaler's endpoints, the pod
    sync's pods) refresh after they commit, in a transaction of their own: refresh_pools.
    `read`: a pool's groups as a sale read them under the lock and left them (check_sale), in
    place of reading them again."""
    pools = list(pools)
    now = timezone.now()
    ledgers, rows = {}, []
    for pool in pools:
        sale = read.get(pool.pk) if read else None
        if sale is not None and sale.groups is not None:
            groups, holders, digest = sale.groups, sale.holders, sale.digest
        else:
            (groups, digest), holders = groups_to_store(pool), None
        ledger = ledgers[pool.pk] = grouped_ledger(pool, groups)
        if holders is None:
            holders = holding_most(h for group, sums in groups.items() for h in _group_holders(group, sums))
        rows.append((pool.pk, now, ledger.figures(), holders[:TOP_HOLDERS], _storable(groups), digest))
    if rows:
        _store(rows)
    return ledgers


_STORED_COLUMNS = ("pool_id", "computed_at", "figures", "holders", "groups", "digest")


def _store(rows: list[tuple[Any, ...]]) -> None:
    """Store ledgers (values of _STORED_COLUMNS), each one version on from the one it replaces
    (1 for a pool's first), in one statement."""
    by_column = {f.attname: f for f in StoredLedger._meta.concrete_fields}
    fields = [by_column[name] for name in _STORED_COLUMNS]
    table, one = _table(StoredLedger), f"(1, {', '.join(['%s'] * len(fields))})"
    updated = ", ".join(f"{c} = excluded.{c}" for c in _STORED_COLUMNS[1:])
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (version, {', '.join(_STORED_COLUMNS)})"
            f" VALUES {', '.join([one] * len(rows))}"
            f" ON CONFLICT (pool_id) DO UPDATE SET version = {table}.version + 1, {updated}",
            [
                f.get_db_prep_save(value, connection)
                for row in rows
                for f, value in zip(fields, row, strict=True)
            ],
        )


def refresh_pools(pool_ids: Iterable[int]) -> dict[int, PoolLedger]:
    """refresh_ledgers in a transaction of its own under the pools' locks, for a writer whose
    writes are committed (never call it holding rows a selling writer may wait for)."""
    with transaction.atomic():
        return refresh_ledgers(locked_pools(pool_ids))


def stored_ledgers(pools: Iterable[GpuPool]) -> dict[int, StoredLedger]:
    """The pools' stored ledgers (StoredLedger.ledger()), one query. A pool that has none yet,
    or whose stored one was counted on another node shape or over-commit than the pool has now
    (a pool written without selling, a changed setting), is refreshed first."""
    pools = list(pools)
    stored = {s.pool_id: s for s in StoredLedger.objects.filter(pool__in=pools).defer("groups")}
    stale = [p.pk for p in pools if (s := stored.get(p.pk)) is None or not counted_as(s.figures, p)]
    if stale:
        refresh_pools(stale)
        stored.update((s.pool_id, s) for s in StoredLedger.objects.filter(pool_id__in=stale).defer("groups"))
    return stored


def counted_as(figures: dict[str, Any], pool: GpuPool) -> bool:
    """Whether stored figures were counted on the pool's node shape and the over-commit now, by
    the ledger's rules now (figures stored before the default shape's rate was kept priced the
    pool at a rate weighted by its sales: they are counted again)."""
    if "default_mu_per_gpu" not in figures:
        return False
    counted = (figures["node_count"], figures["node_shape"][0], figures["overcommit"])
    return counted == (pool.node_count, pool.gpus_per_node, str(overcommit()))


@functools.cache
def stored_sql() -> str:
    """A pool's stored groups, digest, holders and figures (what check_sale takes)."""
    return f"SELECT groups, digest, holders, figures FROM {_table(StoredLedger)} WHERE pool_id = %s"


def json_column(value: Any) -> Any:
    """A JSON column read with a cursor: Django's psycopg loads it as text, for the field."""
    return json.loads(value) if isinstance(value, str) else value


class Sale(NamedTuple):
    """A sale checked (check_sale): the endpoint's reservation before it (MU/min, 0 for none),
    its pool (locked), the pool's groups as the sale leaves them, its holders and its digest
    (what refresh_ledgers stores; holders None: from the groups' lists; groups None: read the
    pool again, its holders being unknown)."""

    current: int
    pool: GpuPool
    groups: dict[Group, Sums] | None
    holders: list[list[int]] | None
    digest: str
