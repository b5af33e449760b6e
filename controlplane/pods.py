"""The cluster's pods in the database, and the pods started on demand: `sync_pods` mirrors the
cluster's pods (of our deployments) into Pod rows, which the routing table serves to routers,
and each endpoint's ready count and state (Celery beat, every second; controlplane.tasks);
`wake` starts a replica of an endpoint at zero on a router's request, within its pool's room
(controlplane.scaling.PoolRoom), the cluster told before the database records it; and
`record_pod_event` records the Kubernetes pod watcher's restarts and crash loops as on-call
Events (the watch_pods command).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db import transaction
from django.db.models import Q

from controlplane import pool_ledgers
from controlplane.endpoints.deployments import DEPLOYMENT_PREFIX, deployment_name, parse_deployment
from controlplane.endpoints.models import Endpoint, Pod
from controlplane.oncall.models import Event
from controlplane.scaling import PoolRoom, scale_event, state_of
from dataplane.cluster.driver import ClusterDriver, ClusterError
from dataplane.wire.pod_events import PodEvent


def sync_pods(cluster: ClusterDriver) -> int:
    """Mirror the cluster's pods (of our deployments) into Pod rows, which the routing table
    serves to routers, and each endpoint's ready count (all versions) and state. Returns rows
    changed."""
    seen = {p.name: (p, ids) for p in cluster.list_pods() if (ids := parse_deployment(p.deployment))}
    known = set(
        Endpoint.objects.filter(pk__in={ids[0] for _, ids in seen.values()}).values_list("pk", flat=True)
    )
    changed = 0
    with transaction.atomic():
        rows = {p.name: p for p in Pod.objects.select_for_update().filter(name__startswith=DEPLOYMENT_PREFIX)}
        gone = [name for name in rows if name not in seen]
        changed += Pod.objects.filter(name__in=gone).delete()[0]
        create, update = [], []
        ready: dict[int, int] = defaultdict(int)
        for name, (state, (endpoint_id, version)) in seen.items():
            ready[endpoint_id] += state.ready
            row = rows.get(name)
            facts = (state.ready, state.url, state.restarts, state.warm, state.ready_after_s)
            if row is None and endpoint_id in known:
                create.append(
                    Pod(
                        endpoint_id=endpoint_id,
                        name=name,
                        url=state.url,
                        ready=state.ready,
                        version=version,
                        restarts=state.restarts,
                        warm=state.warm,
                        ready_after_s=state.ready_after_s,
                    )
                )
            elif row is not None and (row.ready, row.url, row.restarts, row.warm, row.ready_after_s) != facts:
                row.ready, row.url, row.restarts, row.warm, row.ready_after_s = facts
                update.append(row)
        Pod.objects.bulk_create(create)
        Pod.objects.bulk_update(update, ["ready", "url", "restarts", "warm", "ready_after_s", "updated_at"])
        changed += len(create) + len(update)
        # In ascending id, as the horizontal pass locks every endpoint (scaling.horizontal_pass):
        # the model's order (newest first) against the pass's deadlocked the two.
        endpoints = list(
            Endpoint.objects.select_for_update()
            .filter(Q(ready_replicas__gt=0) | Q(pk__in=ready))
            .order_by("pk")
        )
        for e in endpoints:
            e.ready_replicas = ready.get(e.pk, 0)
            e.state = state_of(e)
        Endpoint.objects.bulk_update(endpoints, ["ready_replicas", "state"])
        touched = {rows[name].endpoint_id for name in gone} | {p.endpoint_id for p in [*create, *update]}
    if touched:  # ready pods are the ledger's used GPUs; refreshed once the pods are committed
        pool_ledgers.refresh_pools(Endpoint.objects.filter(pk__in=touched).values_list("pool_id", flat=True))
    return changed


def wake(endpoint: Endpoint, cluster: ClusterDriver, now: datetime) -> bool:
    """A request is waiting for an endpoint at zero: start a replica now, not at the next tick.
    False when it already has replicas. Raises ClusterError when the cluster refuses."""
    with transaction.atomic():
        e = Endpoint.objects.select_for_update(of=("self",)).with_related().get(pk=endpoint.pk)
        if e.desired_replicas > 0:
            return False
        low, high = e.replica_bounds
        replicas = min(max(1, low), max(1, high))
        room = PoolRoom(list(Endpoint.objects.with_related().filter(pool_id=e.pool_id)))
        if room.replicas_for(e) < replicas:
            raise ClusterError(
                f"pool {e.pool.name} has no room for {replicas} replica(s) of {e.name}: its other"
                f" endpoints commit or hold {room.others_gpus(e)} of its {e.pool.node_count} nodes x"
                f" {e.pool.gpus_per_node} GPUs"
            )
        # its deployment is declared, at 0, by every pass
        cluster.scale(deployment_name(e.pk, e.version), replicas)
        waiting = "a request is waiting and the endpoint had no replica"
        scale_event(e, 0, replicas, waiting, {"rule": "wake"}).save()
        e.desired_replicas, e.woken_at = replicas, now
        e.state = state_of(e)
        e.save(update_fields=["desired_replicas", "woken_at", "state", "updated_at"])
    pool_ledgers.refresh_pools([e.pool_id])  # a rollout commits its desired replicas
    return True


def record_pod_event(event: PodEvent) -> Event:
    """A pod event from the Kubernetes pod watcher (restart, crash loop) as an on-call Event,
    on its endpoint (and so its tenant) when the pod's `mu/endpoint` label names one that still
    exists, else on the endpoint the pod is registered with; its version from `mu/version`."""
    endpoint = (
        Endpoint.objects.select_related("tenant").filter(pk=event.endpoint).first()
        if event.endpoint is not None
        else None
    )
    version = event.version
    if endpoint is None:
        pod = Pod.objects.select_related("endpoint__tenant").filter(name=event.pod).first()
        if pod is not None:
            endpoint, version = pod.endpoint, version or pod.version or pod.endpoint.version
    severity = {"warning": Event.Severity.WARNING, "critical": Event.Severity.CRITICAL}
    return Event.record(
        event.kind,
        event.message,
        endpoint=endpoint,
        pod=event.pod,
        version=version,
        severity=severity.get(event.severity, Event.Severity.INFO),
        detail=event.detail,
        reported_by="kubernetes",
    )
