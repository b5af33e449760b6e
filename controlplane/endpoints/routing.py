"""The routing table the routers pull: endpoints with their pricing, limits and pods, and keys.

A client names the endpoint in the request's `model` field; pods serve under that name (the
cluster driver starts them with --served-model-name <endpoint>), so routers forward the body
untouched. Its version is a hash of its content, so a router's `If-None-Match` gets 304 until something a
router cares about changes, whatever changed it.
"""

import hashlib
import json

from django.db.models import Prefetch

from controlplane.endpoints.models import Endpoint, Pod
from controlplane.endpoints.rollouts import traffic
from controlplane.tenants.models import ApiKey


def routing_table() -> dict:
    endpoints = (
        Endpoint.objects.with_related()
        .prefetch_related(Prefetch("pods", queryset=Pod.objects.order_by("name")))
        .order_by("id")
    )
    body = {
        "endpoints": [_endpoint(e) for e in endpoints],
        "api_keys": [
            {"hash": secret_hash, "tenant": tenant}
            for secret_hash, tenant in ApiKey.objects.active()
            .filter(tenant__isnull=False)
            .order_by("id")
            .values_list("secret_hash", "tenant__name")
        ],
    }
    version = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]
    return {"version": version, **body}


def _endpoint(endpoint: Endpoint) -> dict:
    profile = endpoint.profile
    reservation = getattr(endpoint, "reservation", None)
    return {
        "id": endpoint.pk,
        "tenant": endpoint.tenant.name,
        "name": endpoint.name,
        "model": profile.model,
        "policy": endpoint.routing_policy,
        "alpha": profile.alpha,
        "beta": profile.beta,
        "gamma": profile.gamma,
        "mu_per_replica_minute": profile.mu_per_replica_minute,
        "target_concurrency_per_replica": endpoint.target_concurrency_per_replica,
        "scale_to_zero_enabled": endpoint.scale_to_zero_enabled,
        "reservation": (
            {
                "mu_per_minute": reservation.mu_per_minute,
                "best_effort_allowed": reservation.best_effort_allowed,
            }
            if reservation
            else None
        ),
        # Each version's share of requests (rollouts, canaries); a pod serves its version's share.
        "traffic": traffic(endpoint, next(iter(endpoint.active_rollouts), None)),
        "pods": [
            {"name": p.name, "url": p.url, "ready": p.ready, "version": str(p.version or endpoint.version)}
            for p in endpoint.pods.all()
        ],
    }
