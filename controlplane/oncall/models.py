"""Events: everything on-call needs to see, written by probers, the autoscaler and benchmarks.

Events outlive their endpoint (the link is nulled, the name kept in `endpoint_name`), and their
id is the tail cursor. Ids are handed out at insert but become visible at commit, so a reader
that has seen id 11 may not yet see id 10, still in an open transaction. The tail therefore only
hands out events recorded at least SETTLE ago (`EventQuerySet.tail`): past that, every lower id
is committed or rolled back, and "after id N" never misses nor repeats one. Events are written
in short transactions for that reason.
"""

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import models
from django.utils import timezone

from controlplane.tenants.models import Principal, Tenant, TenantScopedQuerySet

if TYPE_CHECKING:  # for the annotation only: on-call's models load without the endpoints app's
    from controlplane.endpoints.models import Endpoint

SETTLE = timedelta(seconds=1)


def may_acknowledge(principal: Principal) -> bool:
    """Who may acknowledge an event: operators only. Acknowledging tells on-call an event is
    handled and takes it off the operators' unacknowledged panel; every event is written by the
    system or by an operator's key (tenants cannot write events), so none is a tenant's to clear.
    Tenants still see who acknowledged their events, and when. The API and the console ask here."""
    return principal.is_operator


class EventQuerySet(TenantScopedQuerySet["Event"]):
    def tail(self, after: int, now: datetime) -> "EventQuerySet":
        """Events after the cursor `after`, oldest first, that can no longer be overtaken."""
        return self.filter(id__gt=after, recorded_at__lte=now - SETTLE).order_by("id")

    def settled_cursor(self, now: datetime) -> int:
        """The cursor to start a tail from: the newest id that can no longer be overtaken."""
        newest = (
            self.filter(recorded_at__lte=now - SETTLE).order_by("-id").values_list("id", flat=True).first()
        )
        return newest or 0


class Event(models.Model):
    class Kind(models.TextChoices):
        HANG = "hang"
        RESTART = "restart"
        CRASH_LOOP = "crash_loop"
        SCALE = "scale"
        CONCURRENCY = "concurrency"
        ROLLOUT = "rollout"
        BENCHMARK = "benchmark"
        RESERVATION = "reservation"
        ENDPOINT = "endpoint"

    class Severity(models.TextChoices):
        INFO = "info"
        WARNING = "warning"
        CRITICAL = "critical"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    severity = models.CharField(max_length=8, choices=Severity.choices, default=Severity.INFO)
    tenant = models.ForeignKey(
        "tenants.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="events"
    )
    endpoint = models.ForeignKey(
        "endpoints.Endpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    endpoint_name = models.CharField(max_length=63, blank=True)
    pod = models.CharField(max_length=253, blank=True)
    message = models.TextField()
    detail = models.JSONField(default=dict, blank=True)
    # When it happened (the reporter's clock); `id` orders arrival.
    time = models.DateTimeField(default=timezone.now)
    # When this server stored it; the tail's settle rule reads it (see the module docstring).
    recorded_at = models.DateTimeField(default=timezone.now, editable=False)
    reported_by = models.CharField(max_length=100, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["tenant", "-id"]),
            models.Index(fields=["endpoint", "-id"]),
            models.Index(fields=["severity", "-id"]),
            models.Index(fields=["kind", "-id"]),
            models.Index(fields=["time"]),
            # The on-call attention panel: crash loops, repeated hangs, restarts per pod by kind
            # and recency; unacknowledged criticals of the last day.
            models.Index(fields=["kind", "time"]),
            models.Index(
                fields=["time"],
                name="oncall_unacked_critical",
                condition=models.Q(severity="critical", acknowledged_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"[{self.severity}] {self.kind}: {self.message}"

    def acknowledge(self, by: str, now: datetime) -> bool:
        """Mark as seen by `by`; False if someone already had (the first acknowledgement stands)."""
        claimed = Event.objects.filter(pk=self.pk, acknowledged_at__isnull=True).update(
            acknowledged_at=now, acknowledged_by=by
        )
        self.refresh_from_db(fields=["acknowledged_at", "acknowledged_by"])
        return claimed == 1

    @classmethod
    def record(
        cls,
        kind: str,
        message: str,
        *,
        endpoint: "Endpoint | None" = None,
        tenant: Tenant | None = None,
        **fields: Any,
    ) -> "Event":
        """Write an event; the endpoint, when given, also sets the tenant."""
        if endpoint is not None:
            tenant = endpoint.tenant
            fields.setdefault("endpoint_name", endpoint.name)
        return cls.objects.create(kind=kind, message=message, endpoint=endpoint, tenant=tenant, **fields)
