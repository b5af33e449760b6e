"""Metered usage from the routers: their per-second Redis rows become each endpoint's used MU/min.

Routers add every finished request to `mu:load:{endpoint_id}:{unix_second}` (see
dataplane.router.metering); this sums the `mu` field over the last minute: 30 requests of 0.24 MU
in the last 60 s -> 7.2 MU/min used. Only endpoints that have pods (or still show usage, so it
decays to zero) are read: one pipelined round trip of HGETs, 60 per endpoint. At fleet scale the
routers should keep per-minute rollups instead (a follow-up noted on the autoscaler issue).
"""

import math

from django.db.models import Q

from controlplane.endpoints.models import Endpoint

WINDOW_S = 60


def collect_usage(redis, now: float) -> int:
    """Update used_mu_per_minute from the last minute of router rows; returns endpoints updated."""
    endpoints = list(
        Endpoint.objects.filter(Q(pods__isnull=False) | Q(used_mu_per_minute__gt=0))
        .distinct()
        .values_list("pk", "used_mu_per_minute")
    )
    if not endpoints:
        return 0
    last = math.floor(now) - 1  # the current second is still being written
    pipe = redis.pipeline(transaction=False)
    for pk, _ in endpoints:
        for second in range(last - WINDOW_S + 1, last + 1):
            pipe.hget(f"mu:load:{pk}:{second}", "mu")
    values = pipe.execute()
    changed = []
    for i, (pk, before) in enumerate(endpoints):
        window = values[i * WINDOW_S : (i + 1) * WINDOW_S]
        used = sum(float(v) for v in window if v is not None) * 60 / WINDOW_S
        if abs(used - before) > 1e-9:
            changed.append(Endpoint(pk=pk, used_mu_per_minute=used))
    Endpoint.objects.bulk_update(changed, ["used_mu_per_minute"])
    return len(changed)
