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
(`refresh_ledgers`), which readers take as stored (`stored_ledgers`): reading, grouping and
storing ledgers is controlplane.pool_ledgers, the tenant's quota and allowances
controlplane.tenant_limits.
"""

import functools
from collections.abc import Callable, Iterable
from copy import copy
from math import ceil
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.utils import timezone

from capacity.ledger import (
    NOTHING,
    AllowanceExceeded,
    Commitment,
    Oversold,
    PoolLedger,
    QuotaExceeded,
    RolloutChange,
    check_demands_change,
    check_holds,
)
from controlplane.capacity.models import (
    GpuPool,
    ModelProfile,
    ProvisionedAllowance,
    Reservation,
)
from controlplane.endpoints import usage
from controlplane.endpoints.models import Endpoint, Pod, Rollout
from controlplane.endpoints.routing import withdraw_after_commit
from controlplane.oncall.models import Event
from controlplane.pool_ledgers import (
    Group,
    RunningRollout,
    Sale,
    StoredRow,
    alike_demands,
    alike_groups,
    alike_sql,
    counted_as,
    from_stored,
    grouped_ledger,
    groups_to_store,
    json_column,
    lock_sql,
    locked_pool,
    locked_pools,
    locked_tenant,
    own_reservation,
    own_rollout,
    refresh_ledgers,
    rollout_replicas,
    running_rollout,
    sale_holders,
    stored_ledgers,
    stored_sql,
    version_key,
)
from controlplane.prepared import Prepared
from controlplane.tenant_limits import check_tenant_allowance, check_tenant_quota, commitment, reserved_mu
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

    def ledger() -> PoolLedger:
        return refused() if refused is not None else grouped_ledger(pool, groups)

    check_demands_change(
        pool.name,
        pool.node_count,
        pool.node_shape,
        alike_demands(groups, endpoint.pk),
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
    read with whether the pool is marked and its digest in one statement (from_stored), so a
    sale reads its own row, an index probe, the profiles and the pool's rollouts in progress,
    not the pool's endpoints; the pool is read whole only when a write that did not take its
    lock has changed it since it was stored (groups_to_store: the sale stores what it reads,
    sell). The
    statements (and the transaction's BEGIN) go in one round trip, pipelined: the server runs
    them in order, so the reads still start, and take their snapshots, once the locks are
    held (lock_sql); what it saves is the waits for the network and, on a busy machine, for a
    core, per statement. The endpoint's row is read by a statement prepared on the connection,
    planned once rather than at every sale."""
    tenant_id, pool_id = endpoint.tenant_id, endpoint.pool_id
    stored: StoredRow | None = None
    if connection.vendor != "postgresql":  # SQLite (development): no row locks, no pipeline
        locked_tenant(tenant_id)
        (pool,) = locked_pools([pool_id])
        groups = None
    else:
        connection.ensure_connection()
        own_execute = own_row().ready()
        with (
            connection.connection.pipeline(),
            connection.cursor() as lock,
            connection.cursor() as base,
            connection.cursor() as own,
        ):
            lock.execute(lock_sql(), [tenant_id, pool_id])
            base.execute(stored_sql(), [pool_id])
            own.execute(own_execute, {"changed": endpoint.pk, "pool": pool_id})
            pool = locked_pool(lock.fetchall(), tenant_id, pool_id)
            row = base.fetchone()
            stored = StoredRow(*row) if row is not None else None
            groups = from_stored(stored, own.fetchall())
    refused = None
    if groups is None or stored is None:  # the pool read whole; its groups list their holders
        (groups, digest), stored = groups_to_store(pool, endpoint.pk), None
    elif counted_as(figures := json_column(stored.figures), pool):  # a refusal carries the stored ledger
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
        return Sale(current, pool, sold, None, digest)
    (own_group,) = (g for g in sold if g[0])
    holders = sale_holders(json_column(stored.holders), own_group, sold[own_group])
    return Sale(current, pool, sold if holders is not None else None, holders, stored.digest)


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
        reserved = reserved_mu(before)
        if before is not None and before.pool_id != endpoint.pool_id:
            _check_move(before, pool, changed or (), by_operator)
        starting = endpoint.rollout_to_start() if before is not None else None
        running = running_rollout(before) if before is not None else None
        rollout = RunningRollout.of(starting) if starting is not None else running
        check_tenant_quota(tenant, endpoint, before, rollout, running)
        replacing = []
        if before is not None and before.pool_id == endpoint.pool_id:
            replacing = endpoint_commitments(before, reserved, running)
        ensure_versions(pool, endpoint, endpoint_commitments(endpoint, reserved, rollout), replacing)
        check_tenant_allowance(tenant, pool, endpoint, before, reserved)
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
            check_tenant_quota(tenant, candidate, before, rollout, rollout)
            reserved = reserved_mu(before)
            ensure_versions(
                pool,
                candidate,
                endpoint_commitments(candidate, reserved, rollout),
                endpoint_commitments(before, reserved, rollout),
            )
            check_tenant_allowance(tenant, pool, candidate, before, reserved)
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
        check_tenant_quota(tenant, before, before, then, now)
        reserved = reserved_mu(before)
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
    return own_row().retried(
        lambda: _sell(
            endpoint, mu_per_minute=mu_per_minute, best_effort_allowed=best_effort_allowed, sold_by=sold_by
        )
    )


def _sell(endpoint: Endpoint, *, mu_per_minute: int, best_effort_allowed: bool, sold_by: str) -> Reservation:
    with transaction.atomic():
        sale = check_sale(endpoint, mu_per_minute)
        current, pool = sale.current, sale.pool
        now = timezone.now()
        (reservation,) = Reservation.objects.raw(
            upsert_sql(), [endpoint.pk, mu_per_minute, best_effort_allowed, sold_by, now, now]
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


def own_row() -> Prepared:
    """What a sale reads of its endpoint beside its pool's stored groups (check_sale), prepared
    on the connection: PostgreSQL took longer to plan it than to run it (1.0-1.5 ms against
    0.3 at 10,000 endpoints)."""
    return Prepared.of(alike_sql(holders=True, own=True))


@functools.cache
def upsert_sql() -> str:
    """The endpoint's reservation set to a sale's terms, made when it has none, in one statement
    (PostgreSQL and SQLite alike): its row as it is then. Two sales on one endpoint do not
    race here: each holds the pool's lock (check_sale)."""
    table = connection.ops.quote_name(Reservation._meta.db_table)
    return (
        f"INSERT INTO {table} (endpoint_id, mu_per_minute, best_effort_allowed, sold_by, created_at,"
        " updated_at) VALUES (%s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (endpoint_id) DO UPDATE SET mu_per_minute = excluded.mu_per_minute,"
        " best_effort_allowed = excluded.best_effort_allowed, sold_by = excluded.sold_by,"
        " updated_at = excluded.updated_at RETURNING *"
    )


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
