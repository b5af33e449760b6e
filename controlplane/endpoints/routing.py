"""The routing table the routers pull: endpoints with their pricing, limits and pods, and keys.

A client names the endpoint in the request's `model` field; pods serve under that name (the
cluster driver starts them with --served-model-name <endpoint>), so routers forward the body
untouched. Its version is a hash of its content, so a router's `If-None-Match` gets 304 until something a
router cares about changes, whatever changed it. The format is dataplane.wire.routing_table.
"""

from django.db.models import Prefetch

from capacity.units import CostModel
from controlplane.endpoints.models import Endpoint, Pod
from controlplane.endpoints.rollouts import traffic
from controlplane.tenants.models import ApiKey
from dataplane.wire.routing_table import ReservedRate, RoutedEndpoint, RoutedPod, RoutingTable


def routing_table() -> RoutingTable:
    endpoints = (
        Endpoint.objects.with_related()
        .prefetch_related(Prefetch("pods", queryset=Pod.objects.order_by("name")))
        .order_by("id")
    )
    api_keys = dict(
        ApiKey.objects.active()
        .filter(tenant__isnull=False)
        .order_by("id")
        .values_list("secret_hash", "tenant__name")
    )
    return RoutingTable.versioned(tuple(_endpoint(e) for e in endpoints), api_keys)


def _endpoint(endpoint: Endpoint) -> RoutedEndpoint:
    profile = endpoint.profile
    reservation = getattr(endpoint, "reservation", None)
    return RoutedEndpoint(
        id=endpoint.pk,
        tenant=endpoint.tenant.name,
        name=endpoint.name,
        model=profile.model,
        policy=endpoint.routing_policy,
        coefficients=CostModel(
            profile.alpha,
            profile.beta,
            profile.gamma,
            rho=profile.rho,
            kappa=profile.kappa,
            delta=profile.delta,
        ),
        mu_per_replica_minute=profile.mu_per_replica_minute,
        target_concurrency=endpoint.target_concurrency_per_replica,
        scale_to_zero_enabled=endpoint.scale_to_zero_enabled,
        reservation=(
            ReservedRate(reservation.mu_per_minute, reservation.best_effort_allowed) if reservation else None
        ),
        pods=tuple(
            RoutedPod(p.name, p.url, p.ready, str(p.version or endpoint.version)) for p in endpoint.pods.all()
        ),
        # Each version's share of requests (rollouts, canaries); a pod serves its version's share.
        traffic=tuple(traffic(endpoint, endpoint.active_rollout).items()),
        max_model_len=profile.max_model_len,
    )
