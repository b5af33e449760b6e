"""Events: everything on-call needs to see, written by probers, the autoscaler and benchmarks.

Events outlive their endpoint (the link is nulled, the name kept in `endpoint_name`), and their
id is the tail cursor: ids only grow, so "events after id N" never misses nor repeats one.
"""

from django.db import models
from django.utils import timezone

from controlplane.tenants.models import TenantScopedQuerySet


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
    reported_by = models.CharField(max_length=100, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["tenant", "-id"]),
            models.Index(fields=["endpoint", "-id"]),
            models.Index(fields=["severity", "-id"]),
            models.Index(fields=["kind", "-id"]),
            models.Index(fields=["time"]),
        ]

    def __str__(self) -> str:
        return f"[{self.severity}] {self.kind}: {self.message}"

    @classmethod
    def record(cls, kind: str, message: str, *, endpoint=None, tenant=None, **fields) -> "Event":
        """Write an event; the endpoint, when given, also sets the tenant."""
        if endpoint is not None:
            tenant = endpoint.tenant
            fields.setdefault("endpoint_name", endpoint.name)
        return cls.objects.create(kind=kind, message=message, endpoint=endpoint, tenant=tenant, **fields)
