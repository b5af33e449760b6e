"""A tenant's bounds on what its endpoints commit: its GPU quota on their minimum and maximum
replicas (`gpu_quota`, checked by `check_tenant_quota`), and its allowance per pool for minimum
replicas beyond its reservations (`allowance`, `check_tenant_allowance`). The writers in
controlplane.selling call these under the tenant's lock (`locked_tenant`)."""

from collections import defaultdict

from django.conf import settings
from django.db.models import QuerySet, Sum

from capacity.ledger import (
    Commitment,
    check_allowance,
    check_quota,
    unreserved_gpus,
)
from controlplane.capacity.models import (
    GpuPool,
    ProvisionedAllowance,
)
from controlplane.endpoints.models import Endpoint, Rollout
from controlplane.pool_ledgers import RunningRollout, overcommit
from controlplane.tenants.models import Tenant
from dataplane.cluster import rollout as phases


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


def commitment(endpoint: Endpoint, reserved_mu_per_minute: int) -> Commitment:
    """What `endpoint`, as it is in memory, commits in its pool with this reservation outside a
    rollout: whole replicas (capacity.ledger)."""
    return endpoint.profile.shape.commitment(reserved_mu_per_minute, endpoint.replica_bounds[0], overcommit())


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


def reserved_mu(endpoint: Endpoint | None) -> int:
    reservation = getattr(endpoint, "reservation", None) if endpoint is not None else None
    return reservation.mu_per_minute if reservation is not None else 0


def check_tenant_quota(
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


def check_tenant_allowance(
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
        used[(e.tenant_id, e.pool_id)] += _unreserved(e, reserved_mu(e))
    return used
