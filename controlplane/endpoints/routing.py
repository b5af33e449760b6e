"""The routing table the routers pull: endpoints with their pricing, limits and pods, and each
tenant's keys' epoch; and the lookup of one key by its digest, which routers make for a key they
do not know (the table no longer carries every key: see dataplane.wire.routing_table).

A client names the endpoint in the request's `model` field; its pods serve the name it was
created under (the cluster driver starts them with --served-model-name <served_model_name>),
which a rename keeps, and the table carries both: routers forward the body untouched until a
rename, then send the pods their name (dataplane.router.served_name). Its version is a hash of
its content, so a router's `If-None-Match` gets 304 until something a router cares about
changes, whatever changed it. The format is dataplane.wire.routing_table.

Building it costs the process about 0.2 s of CPU per 1,000 endpoints
(bench/routing_table_fanout.py), the same for a 304 as for a 200, which 1,000 routers polling
every second could not afford. So with Redis the table is built once a second by one task
(``publish_due``, Celery beat; less often when a build takes over half a second) and kept
there, and the view answers from that copy; every build also PUBLISHes its version on
``dataplane.wire.routing_table.channel``, which routers subscribed to it take as "the table is
still this one" (or "poll now" when it differs), so they poll only on a change. Without Redis,
or when the copy is older than ROUTING_TABLE_STALE_AFTER_S (the task is down), the view builds
the table itself, as before:

    routing-table:published          hash: version, built_at (unix s), build_s (s) of the latest
    routing-table:body:{version}     string: that version's JSON, expiring after BODY_TTL_S
"""

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, OuterRef, Prefetch, Q, Subquery
from django.db.models.functions import Coalesce

from capacity.units import CostModel
from controlplane.endpoints.deployments import context_length, max_token_bytes
from controlplane.endpoints.models import Endpoint, Pod, Rollout
from controlplane.tenants.models import ApiKey, Tenant
from dataplane.wire.routing_table import (
    KeyEpoch,
    KeyLookup,
    ReservedRate,
    RoutedEndpoint,
    RoutedPod,
    RoutingTable,
    channel,
    is_digest,
)

log = logging.getLogger(__name__)

PUBLISHED_KEY = "routing-table:published"
BODY_TTL_S = 120  # a version's body outlives its turn as the current one by this much, s


def routing_table() -> RoutingTable:
    endpoints = (
        Endpoint.objects.with_related()
        .prefetch_related(Prefetch("pods", queryset=Pod.objects.order_by("name")))
        .order_by("id")
    )
    token_bytes = max_token_bytes()
    return RoutingTable.versioned(tuple(_endpoint(e, token_bytes) for e in endpoints), {}, key_epochs())


def key_epochs() -> dict[str, KeyEpoch]:
    """Every tenant's keys' epoch: its id and how many of its keys were ever revoked."""
    tenants = Tenant.objects.annotate(
        revoked=Count("api_keys", filter=Q(api_keys__revoked_at__isnull=False))
    ).values_list("name", "pk", "revoked")
    return {name: KeyEpoch(pk, revoked) for name, pk, revoked in tenants.order_by("name")}


def key_lookup(digest: str) -> KeyLookup:
    """A router's question about a key it does not know: its tenant and the tenant's epoch while
    it is an active tenant key, read in one statement (one snapshot: a revocation committed after
    it raises the epoch the next table carries); ValueError when ``digest`` is not a SHA-256."""
    if not is_digest(digest):
        raise ValueError(f"must be the SHA-256 of a key, 64 lower-case hex digits, got {digest[:80]!r}")
    revoked = (
        ApiKey.objects.filter(tenant=OuterRef("tenant"), revoked_at__isnull=False)
        .order_by()
        .values("tenant")
        .annotate(n=Count("pk"))
        .values("n")
    )
    found = (
        ApiKey.objects.active()
        .filter(secret_hash=digest, tenant__isnull=False)
        .annotate(revoked=Coalesce(Subquery(revoked), 0))
        .values_list("tenant__name", "tenant_id", "revoked")
        .first()
    )
    if found is None:
        return KeyLookup(digest, None, None)
    name, tenant_id, revoked_count = found
    return KeyLookup(digest, name, KeyEpoch(tenant_id, revoked_count))


def _endpoint(endpoint: Endpoint, token_bytes: int) -> RoutedEndpoint:
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
            cached_token_factor=profile.cached_token_factor,
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
        max_model_len=_context(endpoint),
        max_token_bytes=token_bytes,
        served_model_name=endpoint.served_model_name,
    )


def _context(endpoint: Endpoint) -> int:
    """The context its pods serve; during a rollout the larger of both versions': a prompt only
    one of them takes is the pod's to refuse (at no charge), not the router's."""
    rollout = endpoint.active_rollout
    profiles = (endpoint.profile,) if rollout is None else (rollout.from_profile, rollout.to_profile)
    return max(context_length(p) for p in profiles)


def body_key(version: str) -> str:
    """The Redis string of one version's JSON: a 200 reads the body of the version it names."""
    return f"routing-table:body:{version}"


# KEYS: the published hash, the version's body key. ARGV: read_at (us, Redis TIME before the
# build read the database), version, built_at, build_s, body, body TTL s, channel. A build that
# read before the last withdrawal (a revocation it may not have seen), or before the build that
# is there now, writes nothing: it would serve, and announce as current, what is already old.
PUBLISH_LUA = """
local withdrawn = tonumber(redis.call('HGET', KEYS[1], 'withdrawn_at') or '-1')
local newest = tonumber(redis.call('HGET', KEYS[1], 'read_at') or '-1')
local read_at = tonumber(ARGV[1])
if read_at <= withdrawn or read_at < newest then return 0 end
redis.call('SET', KEYS[2], ARGV[5], 'EX', tonumber(ARGV[6]))
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'built_at', ARGV[3], 'build_s', ARGV[4], 'read_at', ARGV[1])
redis.call('PUBLISH', ARGV[7], ARGV[2])
return 1
"""
# KEYS: the published hash. The copy is gone (a poll builds the table) and no build that read
# the database before now may bring it back.
WITHDRAW_LUA = """
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'withdrawn_at', string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2])))
redis.call('HDEL', KEYS[1], 'version', 'built_at')
return 1
"""


def publish(redis: Any, now: float | None = None) -> str | None:
    """Build the table, keep it in Redis for the view, announce its version; returns it, or
    None when a withdrawal (or a newer build) came after this build read the database.

    Safe to run twice at once: the build that read last wins."""
    seconds, micros = redis.time()  # Redis's clock orders builds and withdrawals on any host
    read_at = seconds * 1_000_000 + micros
    started = time.monotonic()
    table = routing_table()
    body = json.dumps(table.to_json(), separators=(",", ":"))
    built_at = time.time() if now is None else now
    build_s = time.monotonic() - started
    written = redis.eval(
        PUBLISH_LUA,
        2,
        PUBLISHED_KEY,
        body_key(table.version),
        read_at,
        table.version,
        repr(built_at),
        repr(build_s),
        body,
        BODY_TTL_S,
        channel(redis),
    )
    return table.version if written else None


def due(built_at: float | None, build_s: float, now: float, interval_s: float) -> bool:
    """Whether the next build is due: ``interval_s`` after the last, or twice its own time after
    it when a build takes longer, so the builder keeps at most half of a worker. A build of 2.25 s
    (10,000 endpoints) last at 1000.0 -> next at 1004.5, not every second."""
    return built_at is None or now - built_at >= max(interval_s, 2.0 * build_s)


def publish_due(redis: Any, now: float, interval_s: float) -> str | None:
    """The beat's task: publish when ``due``; returns the version, or None when it was not (or
    a withdrawal overtook it)."""
    built_at, build_s = redis.hmget(PUBLISHED_KEY, ["built_at", "build_s"])
    if not due(None if built_at is None else float(built_at), float(build_s or 0.0), now, interval_s):
        return None
    return publish(redis, now)


def published(redis: Any, now: float, stale_after_s: float) -> str | None:
    """The version of the copy in Redis when built within ``stale_after_s`` of ``now``; None
    when there is none or it is older (its builder is down: build the table instead). A 304
    reads only this, not the table (5 MB at 10,000 endpoints)."""
    version, built_at = redis.hmget(PUBLISHED_KEY, ["version", "built_at"])
    if version is None or built_at is None or now - float(built_at) > stale_after_s:
        return None
    return str(version.decode())


def published_copy() -> tuple[str, Callable[[], bytes | None]] | None:
    """What the view serves from: the version in Redis (REDIS_URL) while it is fresh, and how
    to read its body; None without Redis, with Redis unreachable or the copy stale (the view
    then builds the table itself)."""
    import redis

    from controlplane.endpoints.samples import redis_client

    if not settings.REDIS_URL:
        return None
    client = redis_client(settings.REDIS_URL)
    try:
        version = published(client, time.time(), settings.ROUTING_TABLE_STALE_AFTER_S)
    except redis.RedisError:
        return None
    if version is None:
        return None

    def body() -> bytes | None:
        try:
            found = client.get(body_key(version))
        except redis.RedisError:
            return None
        return None if found is None else bytes(found)

    return version, body


def withdraw_after_commit() -> None:
    """For a change that must reach routers now, not at the next build (a revoked key): once the
    transaction commits, withdraw the copy, so that a poll builds the table until it is published
    again, and queue that publication (its announcement makes subscribed routers poll) instead
    of waiting for the beat, which at 10,000 endpoints builds every few seconds."""
    if not settings.REDIS_URL:
        return  # the view builds the table for every poll: nothing to withdraw

    def withdraw() -> None:
        from controlplane.endpoints.samples import redis_client
        from controlplane.endpoints.tasks import publish_routing_table

        try:
            redis_client(settings.REDIS_URL).eval(WITHDRAW_LUA, 1, PUBLISHED_KEY)
            publish_routing_table.delay(force=True)
        except Exception as exc:  # Redis or the broker down: the view builds, the beat publishes
            log.warning("could not withdraw the published routing table (%s)", exc)

    transaction.on_commit(withdraw)


def traffic(endpoint: Endpoint, active: Rollout | None) -> dict[str, int]:
    """Each running version's share of the endpoint's requests, in percent (controlplane.rollouts
    sets the shares)."""
    if active is None:
        return {str(endpoint.version): 100}
    return {str(active.from_version): 100 - active.new_percent, str(active.to_version): active.new_percent}


def withdraw_on_revoke(sender: object, **kwargs: object) -> None:
    """A key revoked (controlplane.tenants.models.key_revoked): routers must refuse it now."""
    withdraw_after_commit()
