"""Rollouts, the control plane's side: the pure phases (dataplane.cluster.rollout) applied to the
database every horizontal pass, the deployments they declare, and the traffic split routers get.

A rollout starts when an endpoint's model changes (controlplane.selling.save_endpoint: a new version). Each
pass advances it from the new version's ready pods, records a `rollout` Event at every phase
change (a canary held past ROLLOUT_MAX_HOLD_S is aborted, with a warning), and declares both
versions' deployments while it runs, each at its share of the endpoint's desired replicas
(dataplane.cluster.rollout.split; the ledger commits the same shares: controlplane.selling).
The routing table carries the split (controlplane.endpoints.routing.traffic: {"1": 100, "2": 0}
while the new version starts; {"1": 90, "2": 10} for a canary), so a version at 0 % takes no
new request while its pods finish what they have.
"""

from collections import defaultdict
from datetime import datetime

from django.conf import settings
from django.db.models import Count

from controlplane import selling
from controlplane.endpoints.deployments import deployment
from controlplane.endpoints.models import Endpoint, Pod, Rollout
from controlplane.oncall.models import Event
from dataplane.cluster import rollout as phases
from dataplane.cluster.driver import Deployment


def config() -> phases.RolloutConfig:
    return phases.RolloutConfig(
        settings.ROLLOUT_DRAIN_S, settings.ROLLOUT_READY_DEADLINE_S, settings.ROLLOUT_MAX_HOLD_S
    )


def advance(endpoints: list[Endpoint], now: datetime) -> list[Deployment]:
    """Move every active rollout on, and return the deployments all endpoints need now."""
    active = {
        r.endpoint_id: r
        for r in Rollout.objects.active()
        .filter(endpoint__in=endpoints)
        .select_related("from_profile__gpu_type", "to_profile__gpu_type")
    }  # fresh, not with_related()'s: an operator's promote or abort may have come since
    ready: dict[tuple[int, int], int] = defaultdict(int)
    if active:
        rows = (
            Pod.objects.filter(endpoint_id__in=active, ready=True)
            .values_list("endpoint_id", "version")
            .annotate(n=Count("id"))
        )
        for endpoint_id, version, n in rows:
            ready[(endpoint_id, version)] = n
    declared = []
    for e in endpoints:
        r = active.get(e.pk)
        if r is None:
            declared.append(deployment(e))
            continue
        step = phases.advance(
            r.state, ready[(e.pk, r.to_version)], e.desired_replicas, now.timestamp(), config()
        )
        if step.event:
            _record(e, r, step, now)  # a rollback reverts e's version and model
        if step.rollout.phase.active:
            old, new = phases.split(step.rollout, e.desired_replicas)
            declared.append(deployment(e, r.from_version, r.from_profile, old))
            declared.append(deployment(e, r.to_version, r.to_profile, new))
        else:
            declared.append(deployment(e))
    return declared


def _record(e: Endpoint, r: Rollout, step: phases.Step, now: datetime) -> None:
    new = step.rollout
    r.phase, r.new_percent, r.phase_since = new.phase.value, new.new_percent, now
    r.save(update_fields=["phase", "new_percent", "phase_since"])
    if new.phase is phases.Phase.ROLLED_BACK:
        # Back to the old model: the endpoint serves what it served before the change.
        e.version, e.profile = r.from_version, r.from_profile
        Endpoint.objects.filter(pk=e.pk).update(version=r.from_version, profile=r.from_profile)
    detail: dict[str, object] = {"rollout": r.pk, "phase": r.phase, "new_percent": r.new_percent}
    if new.phase.active:
        old, to = phases.split(new, e.desired_replicas)
        detail["replicas"] = {str(r.from_version): old, str(r.to_version): to}
    Event.record(
        Event.Kind.ROLLOUT,
        f"{e.name} v{r.from_version} -> v{r.to_version} ({r.to_profile.model}): {step.event}",
        severity=Event.Severity(step.severity),
        tenant=e.tenant,
        endpoint=e,
        reported_by="rollout",
        detail=detail,
    )


def command(endpoint: Endpoint, action: str) -> Rollout:
    """An operator's or the tenant's word on the active rollout: "promote" a canary (checked:
    its new version then starts the rest of its replicas, which must fit the pool and the
    quota, else Oversold or QuotaExceeded) or "abort"; the next pass acts on it. Raises
    Rollout.DoesNotExist when none is active."""
    if action == "promote":
        return selling.check_promote(endpoint)
    if action != "abort":
        raise ValueError(f"rollout action {action!r}: use promote or abort")
    r = Rollout.objects.active().get(endpoint=endpoint)
    r.aborted = True
    r.save(update_fields=["aborted"])
    return r
