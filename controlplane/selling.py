"""Selling capacity: every write that can change what a pool holds, in one place.

The ledger arithmetic is pure (capacity.ledger); this module feeds it from the database and holds
the rules around it. Each write locks the rows it is checked against first (the tenant's row for
a quota check, then the pool rows in id order: `locked_pools`; a sale takes its tenant's and its
pool's in one statement, `check_sale`), then reads the ledger, then
refuses what would oversell (Oversold) or go beyond the tenant's GPU quota (QuotaExceeded), so two
concurrent writes on one pool (or one tenant) serialise on its row and the second sees the first.
A change is checked against the pool's ledger as it stands, with what the change commits and what
it replaces (capacity.ledger.check_change), so a refusal carries the figures /capacity/ shows.
It sits above the capacity and endpoints apps (it reads both), so neither app imports the other.

Capacity is whole replicas packed onto the pools' nodes (capacity.ledger, capacity.packing): a
refusal names the pool, the replicas asked and how many fit. A new endpoint is placed by `place`:
the pool of its GPU type (in its preferred region, when it names one) where the most more of its
replicas fit; a region where none fits is refused (NoPlacement) with what exists elsewhere.

While an endpoint's rollout runs it commits two versions, each its share of the larger of what
the endpoint commits and holds (`rollout_replicas`), in the ledger, in every check of a change
to it (a rollout's start, a promote, a sale, a minimum) and in its tenant's quota
(`bounds_gpus`). A tenant's minimum replicas beyond its reservations are bounded per pool by
its allowance (`allowance`: an operator's ProvisionedAllowance, else one node's worth).

Writers: `save_pool`, `save_profile`, `save_endpoint`, `delete_endpoint`, `sell`, `release`,
`check_promote` and `save_allowance`. The API, the console and `load_demo` all call these, so
each gets the same checks and events; each that changes a pool stores its new ledger
(`refresh_ledgers`), which readers take as stored (`stored_ledgers`).
"""

import functools
import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from copy import copy
from fractions import Fraction
from math import ceil
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Model, QuerySet, Sum
from django.utils import timezone

from capacity.ledger import (
    NOTHING,
    Allocation,
    AllowanceExceeded,
    Commitment,
    Oversold,
    PoolLedger,
    QuotaExceeded,
    RolloutChange,
    Shape,
    check_allowance,
    check_demands_change,
    check_holds,
    check_quota,
    committed_demands,
    pool_ledger,
    unreserved_gpus,
)
from capacity.provisioning import min_replicas, replica_bounds
from controlplane.capacity.models import (
    GpuPool,
    ModelProfile,
    ProvisionedAllowance,
    Reservation,
    StoredLedger,
)
from controlplane.endpoints import usage
from controlplane.endpoints.models import Endpoint, Pod, Rollout
from controlplane.endpoints.routing import withdraw_after_commit
from controlplane.oncall.models import Event
from controlplane.tenants.models import Tenant
from dataplane.cluster import rollout as phases


class EndpointReserved(Exception):
    """Deleting an endpoint that holds a reservation: the sale is ended first, by an operator."""

    def __init__(self, endpoint: Endpoint, reservation: Reservation):
        self.endpoint = endpoint
        self.reservation = reservation
        super().__init__(
            f"endpoint {endpoint.name!r} holds a reservation of {reservation.mu_per_minute} MU/min"
            f" (reservation {reservation.pk}, sold by {reservation.sold_by or 'unknown'}): an operator"
            " releases it first (DELETE /api/v1/reservations/<id>/, or DELETE of the endpoint with"
            " ?release=true)"
        )


class MoveRefused(Exception):
    """Moving an endpoint to another pool that may not move now: a tenant's endpoint that holds
    an operator's reservation (the operator releases or moves it), or one whose pods still run
    in the pool it leaves (the ledger counts ready pods in the endpoint's pool, so they would be
    counted where they do not run). `field` is the request's field that asked for the move."""

    def __init__(
        self, endpoint: Endpoint, field: str, to: GpuPool, reservation: Reservation | None, pods: int
    ):
        self.endpoint, self.field, self.to = endpoint, field, to
        self.reservation, self.pods = reservation, pods
        leaving = f"endpoint {endpoint.name!r} cannot move from pool {endpoint.pool.name!r} to {to.name!r}"
        if reservation is not None and not pods:
            reason = (
                f"it holds a reservation of {reservation.mu_per_minute} MU/min (reservation"
                f" {reservation.pk}, sold by {reservation.sold_by or 'unknown'}): an operator releases"
                " it (DELETE /api/v1/reservations/<id>/) or moves the endpoint"
            )
        else:
            reason = (
                f"{pods} of its pods still run in {endpoint.pool.name!r}: it moves when none runs"
                " (scale it to zero, or delete it and create it in the new region)"
            )
        super().__init__(f"{leaving}: {reason}")


def default_shape() -> Shape:
    return Shape(settings.MU_PER_REPLICA_MINUTE, 1)


def overcommit() -> Fraction:
    return Fraction(str(settings.CAPACITY_OVERCOMMIT))


def gpu_quota(tenant: Tenant) -> int:
    """The tenant's GPU quota: its own, or when it has none the default (`default_gpu_quota`)."""
    return tenant.gpu_quota if tenant.gpu_quota is not None else default_gpu_quota()


def default_gpu_quota() -> int:
    """The quota of a tenant that has none of its own: the fleet's GPUs (every pool's, summed, as
    they are now), and no more than TENANT_GPU_QUOTA_DEFAULT when that is set. A default no
    fleet can hold bounds nothing."""
    fleet = GpuPool.objects.aggregate(gpus=Sum("gpu_count"))["gpus"] or 0
    cap = settings.TENANT_GPU_QUOTA_DEFAULT
    return fleet if cap is None else min(cap, fleet)


def allowance(tenant_id: int, pool: GpuPool) -> tuple[int, str]:
    """GPUs of minimum replicas beyond its reservations the tenant may commit in `pool`, and
    whose word that is: an operator's ProvisionedAllowance, else PROVISIONED_ALLOWANCE_DEFAULT_NODES
    of the pool's nodes (one node by default: room for a warm replica of any model it places)."""
    row = ProvisionedAllowance.objects.filter(tenant_id=tenant_id, pool_id=pool.pk).first()
    if row is not None:
        return row.gpus, f"set by {row.set_by or 'an operator'}"
    nodes = settings.PROVISIONED_ALLOWANCE_DEFAULT_NODES
    return nodes * pool.gpus_per_node, f"the default: {nodes} node(s) of {pool.gpus_per_node} GPUs"


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


def commitment(endpoint: Endpoint, reserved_mu_per_minute: int) -> Commitment:
    """What `endpoint`, as it is in memory, commits in its pool with this reservation outside a
    rollout: whole replicas (capacity.ledger)."""
    return endpoint.profile.shape.commitment(reserved_mu_per_minute, endpoint.replica_bounds[0], overcommit())


class VersionCommitment(NamedTuple):
    """What one version of an endpoint commits in its pool, under its replicas' name in the
    packing (`key`)."""

    key: str
    model: str
    version: int
    commitment: Commitment


def endpoint_commitments(
    endpoint: Endpoint, reserved_mu_per_minute: int, rollout: RunningRollout | None, held: int | None = None
) -> list[VersionCommitment]:
    """What `endpoint`, as it is in memory, commits in its pool with this reservation: its
    commitment, or while `rollout` runs each version's (the new one first, under the endpoint's
    own key), sized on `held` replicas (its desired ones unless said)."""
    own = commitment(endpoint, reserved_mu_per_minute)
    key = demand_key(endpoint)
    if rollout is None:
        return [VersionCommitment(key, endpoint.profile.model, endpoint.version, own)]
    old, new = rollout_replicas(
        rollout.state, own.replicas, endpoint.desired_replicas if held is None else held
    )
    return [
        VersionCommitment(key, endpoint.profile.model, rollout.to_version, Commitment(new, own.shape)),
        VersionCommitment(
            version_key(key, rollout.from_version),
            rollout.from_model,
            rollout.from_version,
            Commitment(old, rollout.from_shape),
        ),
    ]


def demand_key(endpoint: Endpoint) -> str:
    """The endpoint's name in a pool's packing (capacity.packing.ReplicaDemand.key)."""
    return str(endpoint.pk) if endpoint.pk else "new"


def bounds_gpus(endpoint: Endpoint, rollout: RunningRollout | None = None) -> tuple[int, int]:
    """GPUs of the endpoint's (min, max) replicas: what its tenant's quota bounds. While its
    `rollout` runs, both versions' at each bound, each its share (dataplane.cluster.rollout.split)."""
    low, high = endpoint.replica_bounds
    gpus = endpoint.profile.gpus_per_replica
    if rollout is None:
        return low * gpus, high * gpus
    old_gpus = rollout.from_shape.gpus_per_replica
    (old_low, new_low), (old_high, new_high) = (phases.split(rollout.state, n) for n in (low, high))
    return old_low * old_gpus + new_low * gpus, old_high * old_gpus + new_high * gpus


class NoPlacement(Exception):
    """No pool of the endpoint's GPU type in its preferred region places its replicas. `options`
    says what exists: every pool of that GPU type, its region and how many replicas fit there.

    Two views: an operator's (str(): every pool, with what fits in it) and a tenant's
    (`tenant_message` and the fields below: what it needs to act, not other pools' free
    capacity): the pool of its region where most fit (`pool`, None when its region has none),
    how many fit there (`fit_replicas`) and the other regions where a pool would place them
    (`regions_that_fit`, names only)."""

    def __init__(self, region: str, profile: ModelProfile, replicas: int, options: list[tuple[GpuPool, int]]):
        self.region = region
        self.model = profile.model
        self.gpu_type = profile.gpu_type.name
        self.gpus_per_replica = profile.gpus_per_replica
        self.replicas = replicas
        self.options = options
        here = [(p, fit) for p, fit in options if p.region == region]
        best = max(here, key=lambda pf: pf[1], default=None)  # ties: the first, by name (place())
        self.pool: str | None = best[0].name if best else None
        self.fit_replicas = best[1] if best else 0
        self.regions_that_fit = sorted(
            {p.region for p, fit in options if p.region != region and fit >= replicas}
        )
        there = [f"{p.name} in {p.region} ({fit})" for p, fit in options if p.region != region]
        super().__init__(
            f"{self._asked()}: "
            + (
                f"in {region}, replicas that fit: {', '.join(f'{p.name} ({fit})' for p, fit in here)}"
                if here
                else f"no {self.gpu_type} pool is in {region}"
            )
            + (f"; elsewhere: {', '.join(there)}" if there else "; there is none elsewhere")
        )

    def _asked(self) -> str:
        return (
            f"no {self.gpu_type} pool in region {self.region!r} places {self.replicas} replica(s) of"
            f" {self.model} ({self.gpus_per_replica} GPUs each)"
        )

    def tenant_message(self) -> str:
        """The refusal as a tenant reads it: its region's best pool and the regions that fit."""
        here = (
            f"{self.fit_replicas} fit in pool {self.pool}"
            if self.pool is not None
            else f"no {self.gpu_type} pool is in {self.region}"
        )
        there = ", ".join(self.regions_that_fit)
        return f"{self._asked()}: {here}; " + (
            f"they would fit in region(s) {there}" if there else "no other region would place them"
        )


def place(profile: ModelProfile, region: str = "", replicas: int = 0) -> GpuPool | None:
    """The pool for a new endpoint of `profile` with `replicas` committed: the pool of its GPU
    type (in `region` when one is preferred) where the most more replicas of it fit (ties: by
    name). With a region, a pool there must place the replicas, else NoPlacement names what
    exists elsewhere; without one the roomiest pool is returned as it is (the save refuses an
    oversell with the pool's figures). None when no pool has the GPU type."""
    pools = list(GpuPool.objects.filter(gpu_type_id=profile.gpu_type_id).order_by("name"))
    stored = stored_ledgers(pools)  # a choice, not a check: the save checks under the pool's lock
    fits = [(p, stored[p.pk].ledger().more_replicas(profile.gpus_per_replica)) for p in pools]
    if region:
        here = [(p, fit) for p, fit in fits if p.region == region and fit >= replicas]
        if not here:
            raise NoPlacement(region, profile, replicas, fits)
        fits = here
    best = max(fits, key=lambda pf: pf[1], default=None)
    return best[0] if best else None


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
# (endpoints, metered MU/min, ready pods, the old version's ready pods, fingerprints), then
# with holders the endpoints listed: [[id, ready pods], ...].
Sums = tuple[Any, ...]


def _table(model: type[Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


@functools.cache
def _lock_sql() -> str:
    """A sale's locks: the tenant's row, then the pool's (the order of locked_tenant then
    locked_pools; FOR NO KEY UPDATE OF takes them in the order named), in one statement."""
    fields = GpuPool._meta.concrete_fields
    columns = ", ".join(f"p.{connection.ops.quote_name(str(f.column))}" for f in fields)
    return (
        f"SELECT {columns} FROM {_table(Tenant)} t, {_table(GpuPool)} p"
        " WHERE t.id = %s AND p.id = %s FOR NO KEY UPDATE OF t, p"
    )


def _locked_pool(rows: list[tuple[Any, ...]], tenant_id: int, pool_id: int) -> GpuPool:
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


def _fingerprint_sql() -> str:
    """One endpoint's fingerprint: a 64-bit hash of its _KEY_SQL but its reservation (0 on
    SQLite, which has no hash: no sale there takes the stored groups). Summed over a pool's
    endpoints, it changes when what any of them is counted from changes (a multiset hash:
    which endpoint holds which key does not matter to the groups). Not the reservation: a sale
    stores the groups it read before its write, with its endpoint's fingerprint as read, and
    reservations are written only under the pool's lock, by the writers that store the pool."""
    if connection.vendor != "postgresql":
        return "0"
    fields = ", ".join(f"coalesce(CAST({k} AS text), '-')" for k in _KEY_SQL if k != "r.mu_per_minute")
    return f"hashtextextended(concat_ws(chr(31), {fields}), 0)"


@functools.cache
def _pool_fingerprint_sql() -> str:
    """The pool's fingerprint as it is now, "endpoints:sum", as _fingerprint computes it from
    groups: one pass over the pool's rows, without its pods or a grouping."""
    return (
        f"SELECT count(*) || ':' || coalesce(sum({_fingerprint_sql()}), 0){_rows_sql(reservations=False)}"
        " WHERE e.pool_id = %(pool)s"
    )


@functools.cache
def _alike_sql(holders: bool = False, own: bool = False) -> str:
    """The pool's endpoints grouped as Group, the changed one apart, with per group (endpoints,
    metered MU summed, ready pods summed, those of a rollout's old version summed, their
    fingerprints summed). Written once as SQL, not built by the ORM per call: the ready pods
    are counted per endpoint in a derived table joined to the rows (one pass over the pool's
    ready pods, not a count per endpoint), which the ORM cannot say without counting each
    endpoint once per pod. With `holders`, each group also lists its endpoints that hold the
    most: [id, ready pods], by ready pods then id (alike endpoints commit alike), TOP_HOLDERS
    of them (all on SQLite, which has no arrays: _group_holders sorts them). With `own`
    (PostgreSQL), only the changed endpoint's row, then the pool's fingerprint, in the one
    statement (the same snapshot): what a sale reads beside the stored groups (check_sale)."""
    ready = "coalesce(ready.n, 0)"
    if not holders:
        listed = ""
    elif connection.vendor == "postgresql":
        listed = f", (array_agg(ARRAY[e.id, {ready}] ORDER BY {ready} DESC, e.id))[1:{TOP_HOLDERS}]"
    else:
        listed = f", json_group_array(json_array(e.id, {ready}))"
    only, pool_fingerprint = (
        (" AND e.id = %(changed)s", f", ({_pool_fingerprint_sql()})") if own else ("", "")
    )
    return (
        f"SELECT e.id = %(changed)s, {', '.join(_KEY_SQL)},"
        " count(*), sum(e.used_mu_per_minute), CAST(coalesce(sum(ready.n), 0) AS bigint),"
        f" CAST(coalesce(sum(old.n), 0) AS bigint), coalesce(sum({_fingerprint_sql()}), 0)"
        f"{listed}{pool_fingerprint}{_rows_sql()}"
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
        cursor.execute(_alike_sql(holders), {"changed": changed, "pool": pool.pk})
        return _groups(cursor.fetchall())


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
    for i, (group, sums) in enumerate(groups.items()):
        key = str(changed) if group[0] else f"alike-{i}"
        (own if group[0] else others).extend(_group_allocations(group, sums, key))
    return others, own


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
    listed = sums[5]
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


def _fingerprint(groups: dict[Group, Sums]) -> str:
    """The pool's fingerprint ("endpoints:sum", as _pool_fingerprint_sql reads it) from its
    groups; empty on SQLite."""
    if connection.vendor != "postgresql":
        return ""
    return f"{sum(s[0] for s in groups.values())}:{sum(int(s[4]) for s in groups.values())}"


def _storable(groups: dict[Group, Sums]) -> list[list[Any]]:
    """The groups as StoredLedger.groups keeps them: none apart (the changed endpoint's merged
    into its alike group), without the endpoints listed."""
    merged: dict[Group, list[Any]] = {}
    for group, sums in groups.items():
        into = merged.setdefault((False, *group[1:]), [0, 0.0, 0, 0, 0])
        into[1] += sums[1] or 0.0
        for i in (0, 2, 3, 4):
            into[i] += int(sums[i])
    return [[list(group), sums] for group, sums in merged.items()]


class StoredRow(NamedTuple):
    """What a sale reads of its pool's StoredLedger (_stored_sql), JSON as the cursor gives it."""

    groups: Any
    fingerprint: str
    holders: Any
    figures: Any


def _from_stored(stored: StoredRow | None, own: list[tuple[Any, ...]]) -> dict[Group, Sums] | None:
    """The pool's groups, the changed endpoint apart, from the stored groups and the endpoint's
    own row (alike_groups' shape): the stored groups less the endpoint, then the endpoint as it
    is. None when they cannot be taken: no stored groups, or a pool fingerprint (read with the
    endpoint's row) other than the stored one, a write that did not hold the pool's lock (the
    autoscaler's targets and desired replicas, a rollout's step) having changed what some
    endpoint is counted from since; then the caller reads the pool. Equal fingerprints mean
    the stored groups count every endpoint from what it is counted from now (a sale, a release,
    a minimum, a model or a price each store the pool's groups under its lock), so the check
    is the one a read of the pool would make. Their metered MU and ready pods may be as they
    were stored (the writers of those store the pool once they commit)."""
    if stored is None or not own or not stored.groups:
        return None
    (row,) = own
    group, sums, live = tuple(row[:_GROUP]), tuple(row[_GROUP:-1]), row[-1]
    if stored.fingerprint != live:
        return None
    groups: dict[Group, Sums] = {tuple(g): tuple(v) for g, v in _json(stored.groups)}
    alike = (False, *group[1:])
    counted = groups.pop(alike, None)
    if counted is None or counted[0] < 1:  # equal fingerprints say it is there
        return None
    if counted[0] > 1:
        groups[alike] = (
            counted[0] - 1,
            counted[1] - (sums[1] or 0.0),
            *(counted[i] - int(sums[i]) for i in (2, 3, 4)),
        )
    groups[group] = sums
    return groups


def _sale_holders(holders: list[list[int]], group: Group, sums: Sums) -> list[list[int]] | None:
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
    versions = dict(StoredLedger.objects.filter(pool__in=pools).values_list("pool_id", "version"))
    now = timezone.now()
    ledgers, rows = {}, []
    for pool in pools:
        sale = read.get(pool.pk) if read else None
        if sale is not None and sale.groups is not None:
            groups, holders = sale.groups, sale.holders
        else:
            groups, holders = alike_groups(pool, holders=True), None
        ledger = ledgers[pool.pk] = grouped_ledger(pool, groups)
        if holders is None:
            holders = holding_most(h for group, sums in groups.items() for h in _group_holders(group, sums))
        rows.append(
            StoredLedger(
                pool=pool,
                version=versions.get(pool.pk, 0) + 1,
                computed_at=now,
                figures=ledger.figures(),
                holders=holders[:TOP_HOLDERS],
                groups=_storable(groups),
                fingerprint=_fingerprint(groups),
            )
        )
    StoredLedger.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["pool"],
        update_fields=["version", "computed_at", "figures", "holders", "groups", "fingerprint"],
    )
    return ledgers


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
    stale = [p.pk for p in pools if (s := stored.get(p.pk)) is None or not _counted_as(s.figures, p)]
    if stale:
        refresh_pools(stale)
        stored.update((s.pool_id, s) for s in StoredLedger.objects.filter(pool_id__in=stale).defer("groups"))
    return stored


def _counted_as(figures: dict[str, Any], pool: GpuPool) -> bool:
    """Whether stored figures were counted on the pool's node shape and the over-commit now."""
    counted = (figures["node_count"], figures["node_shape"][0], figures["overcommit"])
    return counted == (pool.node_count, pool.gpus_per_node, str(overcommit()))


def ensure_change(
    pool: GpuPool,
    endpoint: Endpoint,
    asked: Commitment,
    replacing: Commitment = NOTHING,
    groups: dict[Group, tuple[Any, ...]] | None = None,
    rollout: RolloutChange | None = None,
    refused: Callable[[], PoolLedger] | None = None,
) -> None:
    """Raise Oversold unless `pool` places `asked` (the endpoint's replicas; its new version's
    while a `rollout` runs, the old one's beside them) in place of `replacing`. The caller holds
    the pool's lock (locked_pools) inside a transaction. One read of the pool (alike_groups, or
    the caller's `groups` read under the lock): the check packs its other committed replicas
    beside `asked`; a refusal's ledger (the figures pool_ledgers gives, without names) is built
    from the same rows (the endpoint's own as stored, and the ready pods), not read again, or
    is the caller's (`refused`: the stored one, when the groups are its)."""
    if groups is None:
        groups = alike_groups(pool, changed=endpoint.pk)
    others, _ = alike_allocations(groups, endpoint.pk)

    def ledger() -> PoolLedger:
        return refused() if refused is not None else grouped_ledger(pool, groups)

    check_demands_change(
        pool.name,
        pool.node_count,
        pool.node_shape,
        committed_demands(others, overcommit()),
        demand_key(endpoint),
        endpoint.profile.model,
        asked,
        replacing,
        ledger,
        rollout,
    )


def ensure_versions(
    pool: GpuPool,
    endpoint: Endpoint,
    asked: list[VersionCommitment],
    replacing: list[VersionCommitment],
    groups: dict[Group, tuple[Any, ...]] | None = None,
    refused: Callable[[], PoolLedger] | None = None,
) -> None:
    """ensure_change for an endpoint's versions (endpoint_commitments) after a change in place
    of before it, each matched to its own by version number: at a rollout's start the new
    version replaces nothing and the old one what the endpoint commits now."""
    now = {v.version: v.commitment for v in replacing}
    own, *old = asked
    rollout = None
    if old:
        (o,) = old
        rollout = RolloutChange(
            own.version, o.version, o.key, o.model, o.commitment, now.get(o.version, NOTHING)
        )
    ensure_change(pool, endpoint, own.commitment, now.get(own.version, NOTHING), groups, rollout, refused)


def check_sale(endpoint: Endpoint, mu_per_minute: int) -> "Sale":
    """The check a sale of `mu_per_minute` on `endpoint` meets (Oversold when its pool does not
    place it), inside the caller's transaction: the tenant's and the pool's locks in one
    statement, then the pool's groups, the endpoint's own sale and rollout among them.

    On PostgreSQL the groups come from the pool's stored ledger and the endpoint's own row,
    read with the pool's fingerprint in one statement (_from_stored), so a sale reads its own
    row and one pass over the pool's rows, not its pods or a grouping; the pool is read whole
    only when a write that did not take its lock has changed it since it was stored. The
    statements (and the transaction's BEGIN) go in one round trip, pipelined: the server runs
    them in order, so the reads still start, and take their snapshots, once the locks are
    held (_lock_sql); what it saves is the waits for the network and, on a busy machine, for a
    core, per statement."""
    tenant_id, pool_id = endpoint.tenant_id, endpoint.pool_id
    stored: StoredRow | None = None
    if connection.vendor != "postgresql":  # SQLite (development): no row locks, no pipeline
        locked_tenant(tenant_id)
        (pool,) = locked_pools([pool_id])
        groups = None
    else:
        connection.ensure_connection()
        with (
            connection.connection.pipeline(),
            connection.cursor() as lock,
            connection.cursor() as base,
            connection.cursor() as own,
        ):
            lock.execute(_lock_sql(), [tenant_id, pool_id])
            base.execute(_stored_sql(), [pool_id])
            own.execute(_alike_sql(holders=True, own=True), {"changed": endpoint.pk, "pool": pool_id})
            pool = _locked_pool(lock.fetchall(), tenant_id, pool_id)
            row = base.fetchone()
            stored = StoredRow(*row) if row is not None else None
            groups = _from_stored(stored, own.fetchall())
    refused = None
    if groups is None or stored is None:  # the pool read whole; its groups list their holders
        groups, stored = alike_groups(pool, changed=endpoint.pk, holders=True), None
    elif _counted_as(figures := _json(stored.figures), pool):  # a refusal carries the stored ledger
        refused = functools.partial(PoolLedger.from_figures, figures)
    current = own_reservation(groups)
    rollout, held = own_rollout(groups)
    ensure_versions(
        pool,
        endpoint,
        endpoint_commitments(endpoint, mu_per_minute, rollout, held),
        endpoint_commitments(endpoint, current, rollout, held),
        groups,
        refused,
    )
    sold = {((*g[:4], mu_per_minute, *g[5:]) if g[0] else g): sums for g, sums in groups.items()}
    if stored is None:
        return Sale(current, pool, sold, None)
    (own_group,) = (g for g in sold if g[0])
    holders = _sale_holders(_json(stored.holders), own_group, sold[own_group])
    return Sale(current, pool, sold if holders is not None else None, holders)


@functools.cache
def _stored_sql() -> str:
    """A pool's stored groups, fingerprint, holders and figures (what check_sale takes)."""
    return f"SELECT groups, fingerprint, holders, figures FROM {_table(StoredLedger)} WHERE pool_id = %s"


def _json(value: Any) -> Any:
    """A JSON column read with a cursor: Django's psycopg loads it as text, for the field."""
    return json.loads(value) if isinstance(value, str) else value


class Sale(NamedTuple):
    """A sale checked (check_sale): the endpoint's reservation before it (MU/min, 0 for none),
    its pool (locked), the pool's groups as the sale leaves them and its holders (what
    refresh_ledgers stores; holders None: from the groups' lists; groups None: read the pool
    again, its holders being unknown)."""

    current: int
    pool: GpuPool
    groups: dict[Group, Sums] | None
    holders: list[list[int]] | None


def save_pool(pool: GpuPool) -> None:
    """Save; a pool shrunk below what is committed in it is refused (Oversold)."""
    with transaction.atomic():
        if pool.pk:
            locked_pools([pool.pk])
        pool.save()
        check_holds(pool.name, refresh_ledgers([pool])[pool.pk])


def save_profile(profile: ModelProfile) -> None:
    """Save; a re-pricing that makes commitments need more GPUs than a pool has is refused.
    The pools it is placed in: its endpoints', and those of endpoints whose rollout in progress
    leaves it (their old version runs it)."""
    with transaction.atomic():
        pools = []
        if profile.pk:
            leaving = Rollout.objects.active().filter(from_profile=profile).values_list("endpoint__pool_id")
            pools = locked_pools(
                [*profile.endpoints.values_list("pool_id", flat=True), *(p for (p,) in leaving)]
            )
        profile.save()
        ledgers = refresh_ledgers(pools)
        for pool in pools:
            check_holds(pool.name, ledgers[pool.pk])


def save_endpoint(
    endpoint: Endpoint, changed: Iterable[str] | None = None, *, by_operator: bool = False
) -> None:
    """Save, refusing what would oversell the endpoint's pool or exceed its tenant's GPU quota
    or its allowance of minimum replicas beyond its reservations there.

    The endpoint commits max(its reservation, its minimum replicas) in its pool (capacity.ledger):
    a raise of its minimum, a move to another pool (its reservation goes along) or a switch to a
    model that needs more GPUs is checked against the pool it lands in. Its tenant's endpoints'
    minimum and maximum replicas, in GPUs, each stay within the tenant's quota, and their
    minimum replicas beyond their reservations within its allowance in each pool. A new
    endpoint starts at its minimum replicas; a model change starts a rollout
    (Endpoint.rollout_to_start), checked as it starts: both versions, the old one at all of
    the endpoint's replicas and the new one at the share it is about to take (rollout_replicas),
    must fit the pool and the quota. A rename changes no pod (they keep serving
    Endpoint.served_model_name) and reaches the routers at their next poll (the published
    routing table is withdrawn).

    `changed` names the fields this write sets on an endpoint read earlier: its other fields are
    re-read under the lock (the checks see what the autoscaler wrote since, say a lower target)
    and only the changed ones are written, so a PATCH never reverts desired_replicas or state.

    A move to another pool (a new region preference or GPU type, or a pool named) is refused
    (MoveRefused) while the endpoint has pods (they run in the pool it leaves; nothing here moves
    a pod), and, unless `by_operator`, when it holds a reservation (sold by an operator: only one
    moves it, and only to a pool that packs it, the check below).
    """
    changed = None if changed is None else list(changed)
    with transaction.atomic():
        # Tenant first, then pools: every writer that takes both takes them in this order.
        tenant = locked_tenant(endpoint.tenant_id)
        before = (
            Endpoint.objects.select_related("profile", "reservation").filter(pk=endpoint.pk).first()
            if endpoint.pk
            else None
        )
        update_fields = None
        if before is not None and changed is not None and not endpoint._state.adding:
            update_fields = _keep_others(endpoint, before, changed)
        pools = {p.pk: p for p in locked_pools({endpoint.pool_id, *([before.pool_id] if before else [])})}
        pool = pools[endpoint.pool_id]
        reserved = _reserved(before)
        if before is not None and before.pool_id != endpoint.pool_id:
            _check_move(before, pool, changed or (), by_operator)
        starting = endpoint.rollout_to_start() if before is not None else None
        running = running_rollout(before) if before is not None else None
        rollout = RunningRollout.of(starting) if starting is not None else running
        _check_quota(tenant, endpoint, before, rollout, running)
        replacing = []
        if before is not None and before.pool_id == endpoint.pool_id:
            replacing = endpoint_commitments(before, reserved, running)
        ensure_versions(pool, endpoint, endpoint_commitments(endpoint, reserved, rollout), replacing)
        _check_allowance(tenant, pool, endpoint, before, reserved)
        if endpoint._state.adding:
            endpoint.desired_replicas = endpoint.replica_bounds[0]
        if starting is not None:
            starting.save()
            endpoint.version = starting.to_version
        endpoint.save(update_fields=update_fields)
        refresh_ledgers(pools.values())
        if before is not None and before.name != endpoint.name:
            usage.renamed(endpoint)
            # routers take the new name (its pods keep theirs) within a poll, however large the table
            withdraw_after_commit()


def _check_move(before: Endpoint, to: GpuPool, changed: Iterable[str], by_operator: bool) -> None:
    reservation = getattr(before, "reservation", None)
    pods = Pod.objects.filter(endpoint_id=before.pk).count()
    if pods or (reservation is not None and not by_operator):
        asked = set(changed)
        field = next((f for f in ("region_preference", "pool") if f in asked), "pool")
        if field == "pool" and before.profile.gpu_type_id != to.gpu_type_id:
            field = "gpu_type"  # a model on another GPU type re-places the endpoint
        raise MoveRefused(before, field, to, reservation, pods)


def _keep_others(endpoint: Endpoint, before: Endpoint, changed: Iterable[str]) -> list[str]:
    """Copy onto `endpoint` the locked row's fields that this write does not set; the fields to
    save (the changed ones, a rollout's version and the update time)."""
    names = {f.name for f in Endpoint._meta.concrete_fields}
    written = {name for name in changed if name in names} | {"updated_at"}
    for field in Endpoint._meta.concrete_fields:
        if field.name not in written and not field.primary_key:
            setattr(endpoint, field.attname, getattr(before, field.attname))
    return sorted(written | {"version"})  # the locked row's, or a new rollout's


def _reserved(endpoint: Endpoint | None) -> int:
    reservation = getattr(endpoint, "reservation", None) if endpoint is not None else None
    return reservation.mu_per_minute if reservation is not None else 0


def _check_quota(
    tenant: Tenant,
    endpoint: Endpoint,
    before: Endpoint | None,
    rollout: RunningRollout | None = None,
    rollout_before: RunningRollout | None = None,
) -> None:
    """The tenant's quota on its endpoints' (min, max) replicas in GPUs (bounds_gpus), with
    `endpoint` as changed (its `rollout` in progress or starting) in place of `before`."""
    others = list(
        Endpoint.objects.filter(tenant=tenant)
        .exclude(pk=endpoint.pk)
        .select_related("profile")
        .only(
            "min_provisioned_concurrency", "max_provisioned_concurrency", "target_concurrency_per_replica",
            "scale_to_zero_enabled", "profile__gpus_per_replica",
        )
    )  # fmt: skip
    rollouts = {
        r.endpoint_id: RunningRollout.of(r)
        for r in Rollout.objects.active().filter(endpoint__in=others).select_related("from_profile")
    }
    others_min = others_max = 0
    for other in others:
        low, high = bounds_gpus(other, rollouts.get(other.pk))
        others_min, others_max = others_min + low, others_max + high
    check_quota(
        tenant.name,
        gpu_quota(tenant),
        bounds_gpus(endpoint, rollout),
        (others_min, others_max),
        bounds_gpus(before, rollout_before) if before is not None else (0, 0),
        rollout is not None,
    )


def _unreserved(endpoint: Endpoint, reserved: int) -> int:
    """GPUs the endpoint's minimum replicas take beyond its reservation (outside a rollout)."""
    sold = endpoint.profile.shape.sold_replicas(reserved, overcommit())
    return unreserved_gpus(commitment(endpoint, reserved), sold)


def _check_allowance(
    tenant: Tenant, pool: GpuPool, endpoint: Endpoint, before: Endpoint | None, reserved: int
) -> None:
    """The tenant's allowance in `pool` for minimum replicas beyond its reservations, with
    `endpoint` as changed in place of `before` (capacity.ledger.check_allowance). A change that
    asks no more beyond its reservation than it had there passes without a read."""
    asked = _unreserved(endpoint, reserved)
    replacing = _unreserved(before, reserved) if before is not None and before.pool_id == pool.pk else 0
    if asked <= replacing:
        return
    others = Endpoint.objects.filter(tenant=tenant, pool=pool)
    if endpoint.pk:
        others = others.exclude(pk=endpoint.pk)
    gpus, source = allowance(tenant.pk, pool)
    check_allowance(
        tenant.name, pool.name, gpus, source, asked, unreserved(others)[(tenant.pk, pool.pk)], replacing
    )


def unreserved(endpoints: "QuerySet[Endpoint]") -> defaultdict[tuple[int, int], int]:
    """GPUs these endpoints commit with their minimum replicas beyond their reservations, per
    (tenant id, pool id): what the tenants' allowances there bound. One query."""
    used: defaultdict[tuple[int, int], int] = defaultdict(int)
    for e in endpoints.select_related("profile", "reservation"):
        used[(e.tenant_id, e.pool_id)] += _unreserved(e, _reserved(e))
    return used


def allowed_target(endpoint: Endpoint, target: int) -> int:
    """The target concurrency per replica the vertical autoscaler may set: a lower target means
    more minimum and maximum replicas, checked like any raise (pool, quota and allowance) under
    the tenant's and the pool's locks, which the caller's transaction keeps until it has written
    the target. Refused, the target is held at the lowest that keeps the endpoint's replica
    bounds as they are."""
    with transaction.atomic():
        tenant = locked_tenant(endpoint.tenant_id)
        (pool,) = locked_pools([endpoint.pool_id])
        # The row as it is now, under the locks: a PATCH may have raised its minimum since the
        # caller read `endpoint`, checked at the target then.
        before = Endpoint.objects.select_related("profile", "reservation").get(pk=endpoint.pk)
        candidate = copy(before)
        candidate.target_concurrency_per_replica = target
        rollout = running_rollout(before)
        try:
            _check_quota(tenant, candidate, before, rollout, rollout)
            reserved = _reserved(before)
            ensure_versions(
                pool,
                candidate,
                endpoint_commitments(candidate, reserved, rollout),
                endpoint_commitments(before, reserved, rollout),
            )
            _check_allowance(tenant, pool, candidate, before, reserved)
        except (Oversold, QuotaExceeded, AllowanceExceeded):
            low, high = before.replica_bounds
            keep_low = ceil(before.min_provisioned_concurrency / low) if low else 1
            return max(target, keep_low, ceil(before.max_provisioned_concurrency / high))
    return target


def check_promote(endpoint: Endpoint) -> Rollout:
    """A promote of the endpoint's canary, checked (Oversold, QuotaExceeded) before it is asked:
    the new version then starts the rest of the endpoint's replicas beside the old one's share
    (dataplane.cluster.rollout.promoted), which must fit the pool and the quota. Marks the
    rollout promoted, under the tenant's and the pool's locks; the next pass acts on it.
    Rollout.DoesNotExist when none is active."""
    with transaction.atomic():
        tenant = locked_tenant(endpoint.tenant_id)
        (pool,) = locked_pools([endpoint.pool_id])
        before = Endpoint.objects.select_related("profile", "reservation").get(pk=endpoint.pk)
        r = (
            Rollout.objects.active()
            .select_related("from_profile")
            .select_for_update(of=("self",))
            .get(endpoint_id=endpoint.pk)
        )
        now = RunningRollout.of(r)
        then = now._replace(state=phases.promoted(now.state))
        _check_quota(tenant, before, before, then, now)
        reserved = _reserved(before)
        ensure_versions(
            pool,
            before,
            endpoint_commitments(before, reserved, then),
            endpoint_commitments(before, reserved, now),
        )
        r.promoted = True
        r.save(update_fields=["promoted"])
        refresh_ledgers([pool])
    return r


def save_allowance(allowance: ProvisionedAllowance, *, set_by: str) -> ProvisionedAllowance:
    """Set a tenant's allowance in a pool (one row per pair), under the tenant's lock, so that a
    minimum raise checked against the allowance before waits for it. Lowering it below what the
    tenant's minimums take shrinks nothing: its next raise there is refused."""
    with transaction.atomic():
        locked_tenant(allowance.tenant_id)
        allowance.set_by = set_by
        allowance.save()
        Event.record(
            Event.Kind.RESERVATION,
            f"{set_by} set tenant {allowance.tenant.name}'s allowance in pool {allowance.pool.name}"
            f" to {allowance.gpus} GPUs of minimum replicas beyond its reservations",
            tenant=allowance.tenant,
            reported_by=set_by,
            detail={"pool": allowance.pool.name, "allowance_gpus": allowance.gpus},
        )
    return allowance


def delete_endpoint(endpoint: Endpoint, *, release_by: str | None = None) -> None:
    """Delete, keeping sales: an endpoint with a reservation is refused (EndpointReserved) unless
    `release_by` names the operator who ends the sale here (with its event), then deletes. Its
    usage stays, the tenant's bill, and what routers meter after the delete is billed to it
    (controlplane.endpoints.usage.keep_billing_identity)."""
    with transaction.atomic():
        locked_tenant(endpoint.tenant_id)
        pools = locked_pools([endpoint.pool_id])  # a concurrent sale on it waits, then finds it gone
        # locked: a concurrent delete waits, then finds it gone
        current = Endpoint.objects.select_for_update().filter(pk=endpoint.pk).first()
        if current is None:
            return  # deleted meanwhile, its billing identity kept then
        reservation = Reservation.objects.filter(endpoint_id=endpoint.pk).first()
        if reservation is not None:
            if release_by is None:
                raise EndpointReserved(endpoint, reservation)
            _end_sale(reservation, release_by)  # the ledger is stored once, after the delete
        usage.keep_billing_identity(current)
        endpoint.delete()
        refresh_ledgers(pools)


def sell(endpoint: Endpoint, *, mu_per_minute: int, best_effort_allowed: bool, sold_by: str) -> Reservation:
    """Sell (or change) the endpoint's reservation and write its event; Oversold leaves everything
    as it was. A reservation within what the endpoint's minimum replicas already commit asks no
    more GPUs.

    Atomic on its own; inside a caller's transaction the pool lock is held until that commits.
    """
    with transaction.atomic():
        sale = check_sale(endpoint, mu_per_minute)
        current, pool = sale.current, sale.pool
        reservation, _ = Reservation.objects.update_or_create(
            endpoint=endpoint,
            defaults={
                "mu_per_minute": mu_per_minute,
                "best_effort_allowed": best_effort_allowed,
                "sold_by": sold_by,
            },
        )
        reservation.endpoint = endpoint  # as the caller has it (tenant, profile): not read again
        Event.record(
            Event.Kind.RESERVATION,
            f"{sold_by} sold {mu_per_minute} MU/min on {endpoint.name} (was {current or 0})",
            endpoint=endpoint,
            reported_by=sold_by,
            detail={
                "mu_per_minute": mu_per_minute,
                "previous_mu_per_minute": current or 0,
                "best_effort_allowed": best_effort_allowed,
            },
        )
        refresh_ledgers([pool], {pool.pk: sale})  # no second read: the sale's groups, as sold
    return reservation


def release(reservation: Reservation, *, released_by: str) -> None:
    """End a sale and write its event."""
    endpoint = reservation.endpoint
    with transaction.atomic():
        locked_tenant(endpoint.tenant_id)
        pools = locked_pools([endpoint.pool_id])
        _end_sale(reservation, released_by)
        refresh_ledgers(pools)


def _end_sale(reservation: Reservation, released_by: str) -> None:
    """Delete the reservation and write its event; the caller holds the tenant's and the pool's
    locks and stores the pool's ledger once its writes are done."""
    endpoint = reservation.endpoint
    reservation.delete()
    Event.record(
        Event.Kind.RESERVATION,
        f"{released_by} released {reservation.mu_per_minute} MU/min on {endpoint.name}",
        endpoint=endpoint,
        reported_by=released_by,
        detail={"mu_per_minute": 0, "previous_mu_per_minute": reservation.mu_per_minute},
    )
