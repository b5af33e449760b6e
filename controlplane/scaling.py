"""Autoscaler actuation: the pure deciders (capacity.autoscaler) wired to the load buckets, the
database and a cluster driver (controlplane.drivers), each endpoint decided on its config
(controlplane.autoscaler_config). Celery beat runs `horizontal_pass` every 5 s and
`vertical_pass` every 30 s (controlplane.tasks); the pod mirror and wake are
controlplane.pods'. The buckets (and billing) are the collector's (controlplane.endpoints.collector): the
horizontal pass runs a collect pass first, apart (its own lease and transaction), then reads.

Safety, each in one place:
- One pass at a time, fleet-wide: each pass holds a Lease taken with a filtered update, and a
  pass that comes less than half a tick after the last one is skipped, so two beat ticks at
  once, or two control-plane replicas, never double-scale. A worker that dies mid-pass holds
  the lease until it expires (LEASE_TTL_S), then the next pass takes it.
- No data, no decision: the deciders return no decision when samples do not cover the window
  (see capacity.autoscaler.horizontal); missing router seconds never read as idleness.
- A change reaches the cluster before the database records it: if the driver fails, the
  desired count is unchanged and the next pass tries again, with a warning Event.
- Never more than the pool holds: a scale-up is clamped to the replicas that pack onto the
  pool's nodes (capacity.packing) beside what its other endpoints commit (reservations, minimum
  replicas) or hold (their desired replicas), whichever is larger (`PoolRoom`); a clamp writes
  one warning Event when it starts and one when it ends (Endpoint.clamped_since), not one per tick.
Every change writes an Event worded from the decision that made it (capacity.autoscaler.wording):
a sentence naming the rule that set the replicas, then its numbers, in the message and the detail.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.db.models import Q

from capacity.autoscaler import (
    AutoscalerConfig,
    Bucket,
    EndpointSpec,
    calm,
    decide,
    decide_concurrency,
    forecast,
    series,
    wording,
)
from capacity.autoscaler.horizontal import Decision
from capacity.autoscaler.window import Timeline, aggregate
from capacity.ledger import fit_replicas
from capacity.packing import ReplicaDemand, pack
from controlplane import pool_ledgers, rollouts, selling
from controlplane.autoscaler_config import MINUTE_SETTLE_S, base_config, config_for, history_horizon_s
from controlplane.capacity.models import GpuPool
from controlplane.endpoints import collector, samples
from controlplane.endpoints.deployments import deployment_name
from controlplane.endpoints.models import Endpoint, Lease, LoadBucket, LoadMinute
from controlplane.oncall.models import Event
from controlplane.profile_benchmarks import benchmark_deployments
from dataplane.cluster.driver import ClusterDriver, ClusterError

log = logging.getLogger("controlplane.scaling")

HORIZONTAL = "autoscaler-horizontal"
VERTICAL = "autoscaler-vertical"


@dataclass(frozen=True)
class PassReport:
    decided: int  # endpoints with a decision
    changed: int  # endpoints whose replicas (or target) changed
    failed: int  # changes the cluster refused


class PoolRoom:
    """What each endpoint claims of its pool's nodes during a pass: the larger of the replicas it
    commits (capacity.ledger: its reservation or its minimum replicas) and those it holds (its
    desired replicas); while its rollout runs, each version's share of that, as the ledger
    commits it (controlplane.pool_ledgers.rollout_replicas). An endpoint may grow into the replicas
    that still pack onto the pool's nodes beside the others' claims (capacity.packing: a
    replica's GPUs on one node), never into the over-commit: pods need real GPUs."""

    def __init__(self, endpoints: list[Endpoint]):
        self.claims: dict[int, dict[int, list[ReplicaDemand]]] = defaultdict(dict)
        self.pools: dict[int, GpuPool] = {}
        self.rollouts: dict[int, pool_ledgers.RunningRollout] = {}
        for e in endpoints:
            if (rollout := pool_ledgers.running_rollout(e)) is not None:
                self.rollouts[e.pk] = rollout
            self.update(e)

    def _claim(self, e: Endpoint, held: int) -> list[ReplicaDemand]:
        reservation = getattr(e, "reservation", None)
        reserved = reservation.mu_per_minute if reservation is not None else 0
        versions = selling.endpoint_commitments(e, reserved, self.rollouts.get(e.pk), held)
        # Outside a rollout what it holds beyond its commitment counts too (a rollout's versions
        # are sized on the larger already).
        least = held if len(versions) == 1 else 0
        return [
            ReplicaDemand(
                v.key, v.model, v.commitment.shape.gpus_per_replica, max(v.commitment.replicas, least)
            )
            for v in versions
        ]

    def update(self, e: Endpoint) -> None:
        """Record e's claim as it is now (after a decision changed its desired replicas)."""
        self.claims[e.pool_id][e.pk] = self._claim(e, e.desired_replicas)
        self.pools[e.pool_id] = e.pool

    def _others(self, e: Endpoint) -> list[ReplicaDemand]:
        return [d for pk, ds in self.claims[e.pool_id].items() if pk != e.pk for d in ds if d.count > 0]

    def others_gpus(self, e: Endpoint) -> int:
        return sum(d.gpus * d.count for d in self._others(e))

    def replicas_for(self, e: Endpoint) -> int:
        """The most replicas e may have: those that pack beside the others' claims (in a
        rollout, the most whose versions' shares pack, up to its maximum replicas)."""
        pool = self.pools.get(e.pool_id, e.pool)
        others = self._others(e)
        if e.pk not in self.rollouts:
            return fit_replicas(
                pool.node_count, pool.node_shape, others, selling.demand_key(e), e.profile.gpus_per_replica
            )

        def fits(held: int) -> bool:
            return not pack(
                pool.node_count, pool.node_shape, [*others, *self._claim(e, held)]
            ).unplaced_replicas

        low, high = 0, e.replica_bounds[1]  # the most that fit: fits(low), and not beyond
        if fits(high):
            return high
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        return low


def clamp(e: Endpoint, d: Decision, room: PoolRoom) -> int | None:
    """The replicas the pool has room for when the decision asks more, else None. Only a
    scale-up is clamped, so a replica that does not pack is never asked for; an endpoint already
    above the room (another endpoint's minimum grew) is not shrunk by it, it just grows no
    further."""
    if d.replicas is None or d.replicas <= e.desired_replicas:
        return None
    ceiling = max(room.replicas_for(e), e.desired_replicas)
    return ceiling if d.replicas > ceiling else None


def room_words(e: Endpoint, room: PoolRoom) -> tuple[str, str]:
    """Why its pool held a decision lower: a clause for its sentence, and the pool's numbers."""
    return (
        f"no room for more in pool {e.pool.name}",
        f"pool {e.pool.name} has {e.pool.node_count} nodes x {e.pool.gpus_per_node} GPUs and its"
        f" other endpoints commit or hold {room.others_gpus(e)} GPUs, room for"
        f" {room.replicas_for(e)} replicas of {e.profile.gpus_per_replica} GPUs",
    )


def _clamp_event(e: Endpoint, d: Decision, held: int | None, room: PoolRoom) -> Event | None:
    """The Event that starts or ends a clamp episode, or None inside one (or outside any)."""
    starts = held is not None and e.clamped_since is None
    ends = held is None and d.replicas is not None and e.clamped_since is not None
    if not (starts or ends):
        return None
    detail = {
        "pool": e.pool.name,
        "have_gpus": e.pool.gpu_count,
        "gpus_per_node": e.pool.gpus_per_node,
        "others_gpus": room.others_gpus(e),
        "room_replicas": room.replicas_for(e),
        "gpus_per_replica": e.profile.gpus_per_replica,
    }
    if starts:
        why = wording.explain(d, *room_words(e, room))
        return Event(
            kind=Event.Kind.SCALE,
            severity=Event.Severity.WARNING,
            tenant_id=e.tenant_id,
            endpoint=e,
            endpoint_name=e.name,
            message=f"{e.name}: wants {d.replicas} replicas, clamped to {held}: {why}",
            detail={**detail, "clamp": "start", "asked": d.replicas, "to": held, "rule": d.rule.value},
            reported_by="autoscaler",
        )
    return Event(
        kind=Event.Kind.SCALE,
        tenant_id=e.tenant_id,
        endpoint=e,
        endpoint_name=e.name,
        message=f"{e.name}: no longer clamped: {d.replicas} replicas fit in pool {e.pool.name}",
        detail={**detail, "clamp": "end", "to": d.replicas},
        reported_by="autoscaler",
    )


def load_history(horizons: dict[int, float], ts: float) -> dict[int, list[Bucket]]:
    """Each endpoint's buckets of its last `horizons[id]` seconds (one query: a few distinct
    horizons, as only endpoints with a longer memory, burst_memory_s, read further back)."""
    history: dict[int, list[Bucket]] = defaultdict(list)
    by_horizon: dict[float, list[int]] = defaultdict(list)
    for endpoint_id, horizon in horizons.items():
        by_horizon[horizon].append(endpoint_id)
    spans = Q(pk__in=[])
    for horizon, ids in by_horizon.items():
        spans |= Q(endpoint_id__in=ids, end__gt=ts - horizon - samples.BUCKET_S)
    rows = LoadBucket.objects.filter(spans).values_list(
        "endpoint_id", "end", "seconds", "in_flight", "mu_per_minute", "requests", "p99_latency_s",
        "errors", "backlog_mu", "queued", "mu_squared_per_minute",
    )  # fmt: skip
    for endpoint_id, end, secs, in_flight, mu, requests, p99, errors, backlog, queued, squared in rows:
        # The routers' queue is demand held back at the target concurrency (backlog_mu); as the
        # vertical decider's "engine queue" it would shrink the target, which lengthens the
        # routers' queue: a ratchet. The engines' own queue is not collected yet: 0.
        history[endpoint_id].append(
            Bucket(end, secs, in_flight, mu, requests, 0.0, p99, None, errors, backlog, queued, squared)
        )
    return history


def horizontal_pass(cluster: ClusterDriver | None, now: datetime) -> PassReport | None:
    """Bring the buckets up to date (a collect pass, apart), then set each endpoint's used MU/min
    and, with a cluster, decide replicas for every endpoint and declare them. None when another
    pass holds the lease or ran less than half a tick ago. The endpoints stay locked for the pass
    (one short transaction), so a wake cannot be undone by a stale count."""
    try:
        collector.collect_pass(now)
    except Exception:  # the collector's own failure: decide on the buckets there are
        log.exception("collect pass failed before the horizontal pass")
    lease = Lease.take(HORIZONTAL, now, base_config().tick_s / 2)
    if lease is None:
        return None
    ts = now.timestamp()
    cursor = lease.cursor
    try:
        with transaction.atomic():
            endpoints = list(Endpoint.objects.with_related().select_for_update(of=("self",)).order_by("id"))
            before = {e.pk: _written(e) for e in endpoints}
            collected = collector.collected_through()
            configs = {e.pk: config_for(e) for e in endpoints}
            # The buckets that ended after the last pass's cursor (the last one it judged) are new
            # to the calm history; after a longer pause than the collector catches up, none older
            # than its catch-up exists.
            after = max(lease.cursor, collected - samples.MAX_CATCH_UP_S - samples.BUCKET_S)
            horizons = {
                pk: max(history_horizon_s(c), calm.lookback_s(c, after, ts)) for pk, c in configs.items()
            }
            history = load_history(horizons, ts)
            floors = predicted_minimums(endpoints, configs, history, ts)
            changes, events = [], []
            decided = 0
            room = PoolRoom(endpoints)
            for e in endpoints:
                recent = [b for b in history.get(e.pk, []) if b.end > ts - 60]
                e.used_mu_per_minute = sum(b.mu_per_minute * b.seconds for b in recent) / 60.0
                timeline = Timeline(history.get(e.pk, []))  # in order once, for the calm and the decider
                quiet = _calm_since(e, configs[e.pk], timeline, after, ts)
                e.calm_since = None if quiet is None else datetime.fromtimestamp(quiet, UTC)
                level = _burst_series(e, configs[e.pk], timeline, ts)
                if cluster is None:
                    continue
                spec = _spec(e, configs[e.pk], now, floors.get(e.pk, 0), quiet, level)
                d = decide(spec, timeline, ts)
                decided += d.replicas is not None
                held = clamp(e, d, room)
                if (episode := _clamp_event(e, d, held, room)) is not None:
                    events.append(episode)
                    e.clamped_since = now if held is not None else None
                replicas = d.replicas if held is None else held
                if replicas is not None and replicas != e.desired_replicas:
                    # Worded from this decision, the one that changes the replicas.
                    events.append(decision_event(e, d, replicas, room if held is not None else None))
                    e.desired_replicas = replicas
                    changes.append(e)
                    room.update(e)
            failed = _declare(cluster, endpoints, changes, now) if cluster else 0
            if failed:  # nothing of this pass happened, clamps included: the next pass decides again
                for e in endpoints:
                    e.clamped_since = before[e.pk][WRITTEN.index("clamped_since")]
            written = [e for e in endpoints if _written(e) != before[e.pk]]  # most passes change few
            Endpoint.objects.bulk_update(written, WRITTEN)
            if not failed:
                Event.objects.bulk_create(events)
        # Every pool's stored ledger (metered MU, desired replicas and rollouts' steps are in it),
        # once the pass is committed: not under the endpoints' locks, which a sale may wait on.
        pool_ledgers.refresh_pools({e.pool_id for e in endpoints})
        # Moved only once the pass is committed: one that rolls back leaves the buckets it read
        # to the next pass's calm history, which would otherwise start after them.
        cursor = collected
        return PassReport(decided, len(changes) - failed, failed)
    finally:
        lease.release(now, cursor)


def predicted_minimums(
    endpoints: list[Endpoint],
    configs: dict[int, AutoscalerConfig],
    history: dict[int, list[Bucket]],
    ts: float,
) -> dict[int, int]:
    """For the endpoints with the predictive minimum on: record the last settled minute's
    MU/min (a LoadMinute, once: a later pass finds it there) and return the floor that a peak
    recurring at this time on previous days or weeks needs (capacity.autoscaler.forecast)."""
    predictive = [e for e in endpoints if configs[e.pk].predictive_min]
    if not predictive:
        return {}
    minute = (int(ts) - MINUTE_SETTLE_S) // 60 * 60
    rows = []
    for e in predictive:
        load = aggregate(history.get(e.pk, []), minute, 60.0)
        if load is not None and load.coverage >= configs[e.pk].min_coverage:  # no data: no minute
            rows.append(LoadMinute(endpoint=e, end=minute, mu_per_minute=load.mu_per_minute))
    LoadMinute.objects.bulk_create(rows, ignore_conflicts=True)
    # One query for every such endpoint: the slots each one's forecast reads.
    spans = Q()
    for e in predictive:
        for start, end in forecast.windows(ts, configs[e.pk].forecast_lead_s):
            spans |= Q(endpoint=e, end__gte=start, end__lte=end)
    minutes: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for endpoint_id, end, mu in (
        LoadMinute.objects.filter(spans).order_by("end").values_list("endpoint_id", "end", "mu_per_minute")
    ):
        minutes[endpoint_id].append((end, mu))
    floors = {}
    for e in predictive:
        cfg = configs[e.pk]
        floors[e.pk] = forecast.predicted_min_replicas(
            minutes[e.pk],
            ts,
            float(e.profile.mu_per_replica_minute),
            cfg.target_utilisation,
            cfg.forecast_lead_s,
        )
    return floors


# What a horizontal pass may change on an endpoint row.
WRITTEN = ["desired_replicas", "used_mu_per_minute", "state", "clamped_since", "calm_since", "burst_series"]


def _written(e: Endpoint) -> tuple[Any, ...]:
    return tuple(getattr(e, name) for name in WRITTEN)


def _calm_since(
    e: Endpoint, cfg: AutoscalerConfig, buckets: Timeline, after: float, ts: float
) -> float | None:
    """Its calm history judged on the spans since the last pass (`after`); None where off. Not
    judged before (new, or just turned on): judged on what this pass loaded, its calm starting
    there."""
    if calm.horizon_s(cfg) <= 0:
        return None
    since = e.calm_since.timestamp() if e.calm_since is not None else None
    return calm.quiet_since(since, buckets, after, ts, cfg)


def _burst_series(e: Endpoint, cfg: AutoscalerConfig, buckets: Timeline, ts: float) -> float:
    """Its series of bursts carried on by this pass's buckets (stored on the row), and the MU/min
    that series holds past the burst memory (capacity.autoscaler.series)."""
    previous = None
    if e.burst_series is not None:
        try:
            previous = series.Series.of_rows(e.burst_series)
        except (TypeError, ValueError):  # not as a pass wrote it: one endpoint's state, begun anew
            log.warning("endpoint %s: its burst series is unreadable, begun anew", e.pk, exc_info=True)
    carried = series.carried(previous, buckets, ts, cfg)
    e.burst_series = None if carried is None else carried.rows()
    return series.held(carried, ts, cfg)


def _spec(
    e: Endpoint,
    cfg: AutoscalerConfig,
    now: datetime,
    predicted_min: int = 0,
    quiet_since: float | None = None,
    series_level: float = 0.0,
) -> EndpointSpec:
    low, high = e.replica_bounds
    # A request woke it: the router holds that request, which no sample shows yet; keep a replica.
    woken = e.woken_at is not None and (now - e.woken_at).total_seconds() < cfg.scale_to_zero_grace_s
    return EndpointSpec(
        min_replicas=low,
        max_replicas=high,
        current_replicas=e.desired_replicas,
        target_concurrency_per_replica=e.target_concurrency_per_replica,
        mu_per_replica_minute=float(e.profile.mu_per_replica_minute),
        scale_to_zero_enabled=e.scale_to_zero_enabled and not woken,
        predicted_min_replicas=predicted_min,
        quiet_since=quiet_since,
        series_level=series_level,
        config=cfg,
    )


def _declare(
    cluster: ClusterDriver, endpoints: list[Endpoint], changes: list[Endpoint], now: datetime
) -> int:
    """Advance rollouts, then declare every endpoint's deployments (two while a rollout runs) and
    the benchmarks' engines. On failure, undo this pass's replica changes in memory (the database
    keeps the old counts) and report it. Returns the number of changes lost."""
    declared = rollouts.advance(endpoints, now) + benchmark_deployments(now)
    try:
        cluster.apply(declared)
    except ClusterError as exc:
        for e in changes:
            e.refresh_from_db(fields=["desired_replicas"])
        Event.record(
            Event.Kind.SCALE,
            f"the cluster refused this pass's deployments ({exc}); {len(changes)} changes wait for the next",
            severity=Event.Severity.WARNING,
            reported_by="autoscaler",
        )
        return len(changes)
    for e in endpoints:
        e.state = state_of(e)
    return 0


def scale_event(e: Endpoint, old: int, new: int, why: str, detail: dict[str, Any] | None = None) -> Event:
    """A `scale` Event: "chat: scaled 1 -> 2: " and why, a sentence first, then any numbers."""
    return Event(
        kind=Event.Kind.SCALE,
        tenant_id=e.tenant_id,
        endpoint=e,
        endpoint_name=e.name,
        message=f"{e.name}: scaled {old} -> {new}: {why}",
        detail={"from": old, "to": new, **(detail or {})},
        reported_by="autoscaler",
    )


def decision_event(e: Endpoint, d: Decision, replicas: int, room: PoolRoom | None = None) -> Event:
    """The scale Event of a horizontal decision that took the endpoint from the replicas it was
    decided on (`d.current`) to `replicas`: the decision's own words and figures, and where its
    pool held it lower (`room`), why."""
    why, detail = wording.explain(d), wording.detail(d)
    if room is not None:
        clause, pool = room_words(e, room)
        why = wording.explain(d, f"held at {replicas}: {clause}", pool)
        detail |= {"asked": d.replicas, "reason": why}
    return scale_event(e, d.current, replicas, why, detail)


def state_of(e: Endpoint) -> str:
    if e.desired_replicas == 0:
        return Endpoint.State.SCALED_TO_ZERO if e.scale_to_zero_enabled else Endpoint.State.PENDING
    if e.ready_replicas >= e.desired_replicas:
        return Endpoint.State.READY
    return Endpoint.State.SCALING if e.ready_replicas else Endpoint.State.PENDING


def vertical_pass(cluster: ClusterDriver, now: datetime) -> PassReport | None:
    """Retune each serving endpoint's target concurrency per replica from its last 30 s."""
    lease = Lease.take(VERTICAL, now, base_config().vertical_tick_s / 2)
    if lease is None:
        return None
    try:
        ts = now.timestamp()
        endpoints = list(Endpoint.objects.with_related().filter(ready_replicas__gt=0).order_by("id"))
        configs = {e.pk: config_for(e) for e in endpoints}
        history = load_history({pk: c.vertical_tick_s for pk, c in configs.items()}, ts)
        decided = changed = failed = 0
        retargeted: set[int] = set()  # pools: a target changes the replica bounds, committed
        for e in endpoints:
            cfg = configs[e.pk]
            d = decide_concurrency(
                e.target_concurrency_per_replica, e.ready_replicas, history.get(e.pk, []), ts, cfg
            )
            decided += d.target is not None
            if d.target is None or d.target == e.target_concurrency_per_replica:
                continue
            with transaction.atomic():
                # A lower target raises the replica bounds: committed capacity, checked under the
                # pool's lock, held until the new target is written.
                target, reason = d.target, d.reason
                if d.target < e.target_concurrency_per_replica:
                    target = selling.allowed_target(e, d.target)
                    if target != d.target:
                        reason += (
                            f"; held at {target}: more minimum or maximum replicas do not fit in pool"
                            f" {e.pool.name} or tenant {e.tenant.name}'s GPU quota"
                        )
                if target == e.target_concurrency_per_replica:
                    continue
                try:
                    cluster.set_target_concurrency(deployment_name(e.pk, e.version), target)
                except ClusterError as exc:
                    failed += 1
                    log.warning("target concurrency of %s not pushed: %s", e, exc)
                    continue
                old = e.target_concurrency_per_replica
                Endpoint.objects.filter(pk=e.pk).update(target_concurrency_per_replica=target)
                Event.record(
                    Event.Kind.CONCURRENCY,
                    f"{e.name}: target concurrency per replica {old} -> {target}: {reason}",
                    tenant=e.tenant,
                    endpoint=e,
                    reported_by="autoscaler",
                    detail={"from": old, "to": target, "reason": reason},
                )
                changed += 1
                retargeted.add(e.pool_id)
        pool_ledgers.refresh_pools(retargeted)
        return PassReport(decided, changed, failed)
    finally:
        lease.release(now)
