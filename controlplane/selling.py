"""Selling capacity: every write that can change what a pool holds, in one place.

The ledger arithmetic is pure (capacity.ledger); this module feeds it from the database and holds
the rules around it. Each write locks the pool rows first (`locked_pools`, in id order), then
reads the ledger, then refuses an oversell (Oversold), so two concurrent sales on one pool
serialise on the pool row and the second sees the first. It sits above the capacity and
endpoints apps (it reads both), so neither app imports the other to check a sale.

Writers: `save_pool`, `save_profile`, `save_endpoint`, `sell` and `release`. The API, the
console and `load_demo` all call these, so each gets the same checks and the same events.
"""

from collections import defaultdict
from collections.abc import Iterable
from fractions import Fraction

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Sum

from capacity.ledger import Allocation, PoolLedger, Shape, check_sale, pool_ledger
from controlplane.capacity.models import GpuPool, ModelProfile, Reservation
from controlplane.endpoints.models import Endpoint
from controlplane.oncall.models import Event


def default_shape() -> Shape:
    return Shape(settings.MU_PER_REPLICA_MINUTE, 1)


def overcommit() -> Fraction:
    return Fraction(str(settings.CAPACITY_OVERCOMMIT))


def pool_ledgers(
    pools: Iterable[GpuPool], *, excluding_endpoint_id: int | None = None
) -> dict[int, PoolLedger]:
    """Ledgers of these pools in two queries, whatever the number of endpoints."""
    pools = list(pools)
    rows = (
        Endpoint.objects.filter(pool__in=pools)
        # None excludes nothing (Django reads pk=None as IS NULL); the plugin wants a key here.
        .exclude(pk=excluding_endpoint_id)  # type: ignore[misc]
        .values("pool_id", "profile__model", "profile__mu_per_replica_minute", "profile__gpus_per_replica")
        .annotate(sold=Sum("reservation__mu_per_minute"), used=Sum("used_mu_per_minute"), n=Count("id"))
        .order_by()
    )
    allocations: dict[int, list[Allocation]] = defaultdict(list)
    for row in rows:
        allocations[row["pool_id"]].append(
            Allocation(
                shape=Shape(row["profile__mu_per_replica_minute"], row["profile__gpus_per_replica"]),
                model=row["profile__model"],
                sold_mu_per_minute=Fraction(row["sold"] or 0),
                used_mu_per_minute=Fraction(str(row["used"] or 0)),
            )
        )
    return {
        pool.pk: pool_ledger(pool.gpu_count, overcommit(), allocations[pool.pk], default_shape())
        for pool in pools
    }


def roomiest_pool(profile: ModelProfile) -> GpuPool | None:
    """The pool of the profile's GPU type with the most unsold GPUs (ties: by name)."""
    pools = list(GpuPool.objects.filter(gpu_type_id=profile.gpu_type_id).order_by("name"))
    ledgers = pool_ledgers(pools)
    return max(pools, key=lambda p: ledgers[p.pk].headroom_gpus, default=None)


def locked_pools(pool_ids: Iterable[int]) -> list[GpuPool]:
    """Lock pool rows (in id order, so two writers never deadlock). Call inside atomic()."""
    return list(GpuPool.objects.select_for_update().filter(pk__in=set(pool_ids)).order_by("pk"))


def ensure_capacity(
    pool: GpuPool,
    *,
    shape: Shape | None = None,
    asked_mu_per_minute: int = 0,
    excluding_endpoint_id: int | None = None,
    replacing_mu: int = 0,
) -> PoolLedger:
    """Raise Oversold unless `pool` holds what is sold (minus one endpoint) plus what is asked.

    The caller holds the pool's lock (locked_pools) inside a transaction.
    """
    ledger = pool_ledgers([pool], excluding_endpoint_id=excluding_endpoint_id)[pool.pk]
    check_sale(pool.name, ledger, shape or default_shape(), asked_mu_per_minute, replacing_mu)
    return ledger


def save_pool(pool: GpuPool) -> None:
    """Save; a pool shrunk below what is sold in it is refused (Oversold)."""
    with transaction.atomic():
        if pool.pk:
            locked_pools([pool.pk])
        pool.save()
        ensure_capacity(pool)


def save_profile(profile: ModelProfile) -> None:
    """Save; a re-pricing that makes reservations need more GPUs than a pool has is refused."""
    with transaction.atomic():
        pools = locked_pools(profile.endpoints.values_list("pool_id", flat=True)) if profile.pk else []
        profile.save()
        for pool in pools:
            ensure_capacity(pool)


def save_endpoint(endpoint: Endpoint) -> None:
    """Save, refusing a move or model change that would oversell the endpoint's pool.

    A reserved endpoint moved to another pool, or switched to a model that needs more GPUs per
    MU, takes its reservation along; the pool it lands in must hold it. A new endpoint starts at
    its minimum replicas; a model change starts a rollout (Endpoint.start_rollout_if_the_model_changed).
    """
    with transaction.atomic():
        reservation = None
        if endpoint.pk:
            (pool,) = locked_pools([endpoint.pool_id])
            reservation = Reservation.objects.filter(endpoint_id=endpoint.pk).first()
        if reservation is not None:
            ensure_capacity(
                pool,
                shape=endpoint.profile.shape,
                asked_mu_per_minute=reservation.mu_per_minute,
                excluding_endpoint_id=endpoint.pk,
            )
        if endpoint._state.adding:
            endpoint.desired_replicas = endpoint.replica_bounds[0]
        if endpoint.pk and not endpoint._state.adding:
            endpoint.start_rollout_if_the_model_changed()
        endpoint.save()


def sell(endpoint: Endpoint, *, mu_per_minute: int, best_effort_allowed: bool, sold_by: str) -> Reservation:
    """Sell (or change) the endpoint's reservation and write its event; Oversold leaves everything
    as it was.

    Atomic on its own; inside a caller's transaction the pool lock is held until that commits.
    """
    with transaction.atomic():
        (pool,) = locked_pools([endpoint.pool_id])
        current = (
            Reservation.objects.filter(endpoint=endpoint).values_list("mu_per_minute", flat=True).first()
        )
        ensure_capacity(
            pool,
            shape=endpoint.profile.shape,
            asked_mu_per_minute=mu_per_minute,
            excluding_endpoint_id=endpoint.pk,
            replacing_mu=current or 0,
        )
        reservation, _ = Reservation.objects.update_or_create(
            endpoint=endpoint,
            defaults={
                "mu_per_minute": mu_per_minute,
                "best_effort_allowed": best_effort_allowed,
                "sold_by": sold_by,
            },
        )
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
    return reservation


def release(reservation: Reservation, *, released_by: str) -> None:
    """End a sale and write its event."""
    endpoint = reservation.endpoint
    with transaction.atomic():
        reservation.delete()
        Event.record(
            Event.Kind.RESERVATION,
            f"{released_by} released {reservation.mu_per_minute} MU/min on {endpoint.name}",
            endpoint=endpoint,
            reported_by=released_by,
            detail={"mu_per_minute": 0, "previous_mu_per_minute": reservation.mu_per_minute},
        )
