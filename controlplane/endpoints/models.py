"""Endpoints: what a tenant serves, where, and within which concurrency bounds.

Think of Databricks' served entity (model, min/max provisioned concurrency, scale to zero) and
KServe's minReplicas/maxReplicas/containerConcurrency. The autoscaler owns the replica counts,
the state and target_concurrency_per_replica after creation; the router meters used MU.
"""

import os
import socket
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from capacity.provisioning import bounds_error, replica_bounds
from controlplane.capacity.models import GpuPool, ModelProfile
from controlplane.tenants.models import Tenant, TenantScopedQuerySet, slug_validator
from dataplane.cluster.rollout import Phase, RolloutState

LEASE_TTL_S = 60  # a pass's lease, s: a dead worker's is free again after it
MAX_CONCURRENCY = 1_000_000  # a sanity bound; beyond it a value is a typo, not a plan
MAX_TARGET_CONCURRENCY = 4096


class EndpointQuerySet(TenantScopedQuerySet["Endpoint"]):
    def with_related(self) -> "EndpointQuerySet":
        """With tenant, pool, profile, reservation, and `active_rollouts` (a list of 0 or 1)."""
        return self.select_related(
            "tenant", "pool__gpu_type", "profile__gpu_type", "reservation"
        ).prefetch_related(
            models.Prefetch(
                "rollouts",
                queryset=Rollout.objects.active().select_related(
                    "from_profile__gpu_type", "to_profile__gpu_type"
                ),
                to_attr="active_rollouts",
            )
        )


class Endpoint(models.Model):
    class RoutingPolicy(models.TextChoices):
        """How the router spreads this endpoint's requests over its pods."""

        P2C_MU = "p2c-mu"  # power of two choices on in-flight model units (default)
        P2C = "p2c"  # power of two choices on in-flight requests
        LEAST_REQUEST = "least-request"
        ROUND_ROBIN = "round-robin"
        RANDOM = "random"

    class State(models.TextChoices):
        PENDING = "pending"  # created, no replica ready yet
        READY = "ready"
        SCALING = "scaling"
        SCALED_TO_ZERO = "scaled_to_zero"
        FAILED = "failed"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="endpoints")
    name = models.CharField(max_length=63, validators=[slug_validator])
    # The model name its pods serve (vLLM's --served-model-name): the name it was created under,
    # kept through renames, so that a rename restarts no pod; the routers send the pods this
    # name whatever the endpoint is called now (dataplane.router.served_name).
    served_model_name = models.CharField(max_length=63, editable=False)
    # The profile names the model and GPU type; the pool must be of that GPU type.
    profile = models.ForeignKey(ModelProfile, on_delete=models.PROTECT, related_name="endpoints")
    pool = models.ForeignKey(GpuPool, on_delete=models.PROTECT, related_name="endpoints")
    # Where the tenant wants it to run: placement picks the roomiest pool of this region where
    # it fits, else refuses (controlplane.selling.place). Blank: any region.
    region_preference = models.CharField(max_length=63, blank=True, validators=[slug_validator])
    min_provisioned_concurrency = models.PositiveIntegerField(
        default=0, validators=[MaxValueValidator(MAX_CONCURRENCY)]
    )
    max_provisioned_concurrency = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_CONCURRENCY)]
    )
    scale_to_zero_enabled = models.BooleanField(default=False)
    target_concurrency_per_replica = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_TARGET_CONCURRENCY)]
    )
    routing_policy = models.CharField(
        max_length=16, choices=RoutingPolicy.choices, default=RoutingPolicy.P2C_MU
    )
    desired_replicas = models.PositiveIntegerField(default=0)
    ready_replicas = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    # Metered by the router (MU/min over the last minute); 0 until traffic flows.
    used_mu_per_minute = models.FloatField(default=0.0)
    # Per-endpoint autoscaler settings over the defaults ({"target_utilisation": 0.6}); checked
    # by capacity.autoscaler.AutoscalerConfig.from_overrides.
    autoscaler = models.JSONField(default=dict, blank=True)
    # When a request woke it from zero: the autoscaler keeps a replica for a grace period after.
    woken_at = models.DateTimeField(null=True, blank=True)
    # Since when the autoscaler holds it below what it asks for, for want of free GPUs in its
    # pool (controlplane.scaling.PoolRoom); null when it is not held. One warning
    # Event per such episode.
    clamped_since = models.DateTimeField(null=True, blank=True)
    # Since when its traffic has not burst (capacity.autoscaler.calm), judged a pass at a time:
    # once this is quiet_after_s old the autoscaler halves its margin, once calm_history_s old
    # (an operator's opt-in) it drops its margins for bursts. Null until judged, and while both
    # are off.
    calm_since = models.DateTimeField(null=True, blank=True)
    # The series of bursts its traffic is in (capacity.autoscaler.series), judged a pass at a
    # time: one [start, end, need MU/min] a burst, times in epoch seconds. A series of one level
    # holds its tallest need past the burst memory. Null while its bursts do not recur.
    burst_series = models.JSONField(null=True, blank=True)
    # The pod template's version: a new model (profile) is a new version, rolled out without
    # downtime (controlplane.rollouts); one cluster deployment per version.
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = EndpointQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="endpoint_name_unique_per_tenant"),
            models.CheckConstraint(
                name="endpoint_min_le_max",
                condition=models.Q(min_provisioned_concurrency__lte=models.F("max_provisioned_concurrency")),
            ),
            models.CheckConstraint(
                name="endpoint_target_positive", condition=models.Q(target_concurrency_per_replica__gte=1)
            ),
        ]
        # The lists (API and console), newest first: a page under a state or of a tenant is an
        # index scan that stops with the page. The name search's trigram index is PostgreSQL's
        # alone (migration 0018).
        indexes = [
            models.Index(fields=["state", "-id"], name="endpoint_state_newest"),
            models.Index(fields=["tenant", "-id"], name="endpoint_tenant_newest"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.name}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self.served_model_name:  # its first save: its pods will serve this name for good
            self.served_model_name = self.name
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "served_model_name"}
        super().save(*args, **kwargs)

    @property
    def active_rollout(self) -> "Rollout | None":
        """The rollout in progress, from the prefetch of EndpointQuerySet.with_related."""
        prefetched: list[Rollout] = self.__dict__["active_rollouts"]
        return prefetched[0] if prefetched else None

    @property
    def replica_bounds(self) -> tuple[int, int]:
        return replica_bounds(
            self.min_provisioned_concurrency,
            self.max_provisioned_concurrency,
            self.target_concurrency_per_replica,
            self.scale_to_zero_enabled,
        )

    def clean(self) -> None:
        errors = {}
        bounds = bounds_error(self.min_provisioned_concurrency, self.max_provisioned_concurrency)
        if bounds:
            errors["min_provisioned_concurrency"] = bounds
        if self.pool_id and self.profile_id and self.pool.gpu_type_id != self.profile.gpu_type_id:
            errors["pool"] = (
                f"pool {self.pool.name!r} holds {self.pool.gpu_type.name} GPUs, but the model"
                f" profile is for {self.profile.gpu_type.name}"
            )
        if errors:
            raise ValidationError(errors)

    def rollout_to_start(self) -> "Rollout | None":
        """The rollout a new profile starts (a new version), not yet saved; None when the profile
        is unchanged. One at a time: a ValidationError naming the model while one runs."""
        before = Endpoint.objects.filter(pk=self.pk).values_list("profile_id", "version").first()
        if before is None or before[0] == self.profile_id:
            return None
        active = Rollout.objects.filter(endpoint_id=self.pk).active().first()
        if active is not None:
            raise ValidationError(
                {
                    "model": f"a rollout to version {active.to_version} is in progress ({active.phase});"
                    " promote, abort or let it finish first"
                }
            )
        # Versions only grow: a rolled-back version's number is not reused (nor its pods' names).
        tried = Rollout.objects.filter(endpoint_id=self.pk).aggregate(v=models.Max("to_version"))["v"] or 0
        return Rollout(
            endpoint_id=self.pk,
            from_version=before[1],
            to_version=max(before[1], tried) + 1,
            from_profile_id=before[0],
            to_profile_id=self.profile_id,
            canary_percent=getattr(self, "canary_percent", 0),
        )


class RolloutQuerySet(models.QuerySet["Rollout"]):
    def active(self) -> "RolloutQuerySet":
        return self.filter(phase__in=[p.value for p in Phase if p.active])


class Rollout(models.Model):
    """An endpoint moving from one version to the next; its phases are dataplane.cluster.rollout's."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="rollouts")
    from_version = models.PositiveIntegerField()
    to_version = models.PositiveIntegerField()
    from_profile = models.ForeignKey(ModelProfile, on_delete=models.PROTECT, related_name="+")
    to_profile = models.ForeignKey(ModelProfile, on_delete=models.PROTECT, related_name="+")
    phase = models.CharField(
        max_length=16, choices=[(p.value, p.value) for p in Phase], default=Phase.STARTING.value
    )
    new_percent = models.PositiveSmallIntegerField(default=0)  # share of traffic on the new version
    canary_percent = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(99)])
    promoted = models.BooleanField(default=False)
    aborted = models.BooleanField(default=False)
    phase_since = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(default=timezone.now)

    objects = RolloutQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint"],
                condition=models.Q(phase__in=[p.value for p in Phase if p.active]),
                name="one_active_rollout_per_endpoint",
            )
        ]

    def __str__(self) -> str:
        return f"endpoint {self.endpoint_id} v{self.from_version} -> v{self.to_version} ({self.phase})"

    @property
    def state(self) -> RolloutState:
        """Its phase, split and commands, as the pure phases (dataplane.cluster.rollout) read them."""
        return RolloutState(
            Phase(self.phase),
            self.new_percent,
            self.phase_since.timestamp(),
            self.canary_percent,
            self.promoted,
            self.aborted,
        )


class PodQuerySet(TenantScopedQuerySet["Pod"]):
    tenant_field = "endpoint__tenant"


class Pod(models.Model):
    """A runtime pod serving an endpoint, as the cluster driver reports it to the routers."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="pods")
    name = models.CharField(max_length=253, unique=True)
    url = models.URLField(max_length=300, help_text="Base URL of the pod's OpenAI-compatible server")
    ready = models.BooleanField(default=False)
    # The endpoint version it runs; null: whatever the endpoint's current version is (pods
    # registered through the API by hand).
    version = models.PositiveIntegerField(null=True, blank=True)
    # As the cluster driver reports them (dataplane.cluster.driver.PodState), for the console.
    restarts = models.PositiveIntegerField(default=0)  # times the pod's engine was restarted
    warm = models.BooleanField(default=False)  # started from a pre-started (warm) process
    ready_after_s = models.FloatField(null=True, blank=True)  # from start to first ready, s
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = PodQuerySet.as_manager()

    class Meta:
        ordering = ["endpoint_id", "name"]

    def __str__(self) -> str:
        return self.name


class LoadBucket(models.Model):
    """Five seconds of an endpoint's traffic, all routers together: the autoscaler's input and
    the console's timeline. Written by the collector (controlplane.endpoints.samples)."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="load")
    end = models.BigIntegerField(help_text="unix seconds at the bucket's end, a multiple of its length")
    seconds = models.PositiveSmallIntegerField(help_text="seconds some router reported")
    in_flight = models.FloatField()  # time-averaged concurrent requests at pods
    queued = models.FloatField(default=0.0)  # time-averaged requests waiting at the routers for a pod
    mu_per_minute = models.FloatField()
    # each request's MU squared, summed, per minute: how lumpy the work is (window.Bucket)
    mu_squared_per_minute = models.FloatField(default=0.0)
    requests = models.PositiveIntegerField()
    queue_depth = models.FloatField()  # most requests waiting for a pod in any second
    backlog_mu = models.FloatField(default=0.0)  # MU of the requests waiting for a pod at its end
    p50_latency_s = models.FloatField(null=True)
    p99_latency_s = models.FloatField(null=True)
    # The routers' latency histogram summed over the bucket (LATENCY_BUCKETS_S, the last count
    # above them all): percentiles over several buckets come from these, not from averaging
    # each bucket's p50 or taking the largest p99.
    latency_counts = models.JSONField(default=list)
    errors = models.PositiveIntegerField()
    throttled = models.PositiveIntegerField()
    ready_replicas = models.PositiveIntegerField()  # when collected, for the timeline
    desired_replicas = models.PositiveIntegerField()

    class Meta:
        ordering = ["endpoint_id", "end"]
        constraints = [models.UniqueConstraint(fields=["endpoint", "end"], name="load_bucket_unique")]
        indexes = [models.Index(fields=["end"])]

    def __str__(self) -> str:
        return f"endpoint {self.endpoint_id} to {self.end}"


class LoadMinute(models.Model):
    """One minute of an endpoint's MU/min, kept for the predictive minimum's daily and weekly
    look-back (capacity.autoscaler.forecast.HISTORY_S), only for endpoints that have it on.
    Written by the horizontal pass from the minute's LoadBuckets."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="minutes")
    end = models.BigIntegerField(help_text="unix seconds at the minute's end, a multiple of 60")
    mu_per_minute = models.FloatField()

    class Meta:
        ordering = ["endpoint_id", "end"]
        constraints = [models.UniqueConstraint(fields=["endpoint", "end"], name="load_minute_unique")]
        indexes = [models.Index(fields=["end"])]

    def __str__(self) -> str:
        return f"endpoint {self.endpoint_id} minute to {self.end}"


class TimelineMinute(models.Model):
    """One minute of an endpoint's LoadBuckets, summed for the timeline charts of a day or a
    week (controlplane.endpoints.timeline): 1,440 rows a day instead of 17,280. Written once,
    after the collector has written every bucket of the minute, kept as long as the buckets."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="timeline_minutes")
    end = models.BigIntegerField(help_text="unix seconds at the minute's end, a multiple of 60")
    last_end = models.BigIntegerField()  # the minute's last bucket's end
    desired_replicas = models.PositiveIntegerField()  # the last bucket's: replicas are a level
    ready_replicas = models.PositiveIntegerField()
    seconds = models.PositiveIntegerField()  # the buckets' seconds, added
    in_flight_s = models.FloatField()  # requests in flight (at pods and queued) x seconds, added
    requests = models.PositiveBigIntegerField()
    latency_counts = models.JSONField(default=list)  # the buckets' histograms, added

    class Meta:
        ordering = ["endpoint_id", "end"]
        constraints = [models.UniqueConstraint(fields=["endpoint", "end"], name="timeline_minute_unique")]
        indexes = [models.Index(fields=["end"])]

    def __str__(self) -> str:
        return f"endpoint {self.endpoint_id} timeline minute to {self.end}"


class UsageHourQuerySet(TenantScopedQuerySet["UsageHour"]):
    """Scoped by the tenant the row keeps, so a deleted endpoint's usage stays its owner's."""


class UsageFigures(models.Model):
    """What a period of usage adds up (controlplane.endpoints.usage.FIGURES)."""

    mu = models.FloatField(default=0.0)  # MU metered
    requests = models.PositiveBigIntegerField(default=0)  # requests finished (at a pod)
    tokens_in = models.PositiveBigIntegerField(default=0)
    tokens_out = models.PositiveBigIntegerField(default=0)
    throttled = models.PositiveBigIntegerField(default=0)  # 429s, never reached a pod
    errors = models.PositiveBigIntegerField(default=0)  # 5xx answers and upstream failures

    class Meta:
        abstract = True


class UsageHour(UsageFigures):
    """One UTC hour of an endpoint's metered usage, all routers and seconds together: what
    /api/v1/usage/ and the console's endpoint page sum by hour or day. Written by the collector
    (controlplane.endpoints.usage.record) from the same router seconds as the LoadBuckets, and
    kept USAGE_RETENTION_DAYS (the buckets only a day).

    It is the tenant's bill, not the endpoint's: it keeps the endpoint's id (no foreign key, so
    deleting the endpoint deletes none of it), name and tenant. A new endpoint under a deleted
    one's name is another id, with usage of its own."""

    endpoint_id = models.BigIntegerField()
    endpoint_name = models.CharField(max_length=63)  # its current name, or the last it had
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage")
    start = models.BigIntegerField(help_text="unix seconds at the hour's start, a multiple of 3600")

    objects = UsageHourQuerySet.as_manager()

    class Meta:
        ordering = ["endpoint_id", "start"]
        constraints = [models.UniqueConstraint(fields=["endpoint_id", "start"], name="usage_hour_unique")]
        # (start, endpoint_id): /api/v1/usage/'s order, so a page is read in order, not sorted;
        # (tenant, start): a tenant's window reads its own hours, not every tenant's of the
        # window nor every hour the tenant ever had
        indexes = [models.Index(fields=["start", "endpoint_id"]), models.Index(fields=["tenant", "start"])]

    def __str__(self) -> str:
        return f"endpoint {self.endpoint_id} hour from {self.start}"


class UsageDayQuerySet(TenantScopedQuerySet["UsageDay"]):
    """Scoped by the tenant the row keeps, as its hours are."""


class UsageDay(UsageFigures):
    """One UTC day of an endpoint's usage: its UsageHours of that day added, written by the same
    transaction as they are (controlplane.endpoints.usage.record), so /api/v1/usage/ by the day
    reads a row per endpoint and day, not 24. The same identity as its hours (renamed with
    them); kept while any of its hours is (USAGE_RETENTION_DAYS)."""

    endpoint_id = models.BigIntegerField()
    endpoint_name = models.CharField(max_length=63)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage_days")
    start = models.BigIntegerField(help_text="unix seconds at the day's start (UTC), a multiple of 86400")

    objects = UsageDayQuerySet.as_manager()

    class Meta:
        ordering = ["endpoint_id", "start"]
        constraints = [models.UniqueConstraint(fields=["endpoint_id", "start"], name="usage_day_unique")]
        indexes = [models.Index(fields=["start", "endpoint_id"]), models.Index(fields=["tenant", "start"])]

    def __str__(self) -> str:
        return f"endpoint {self.endpoint_id} day from {self.start}"


class TenantUsageHour(UsageFigures):
    """One UTC hour of a tenant's usage: its endpoints' UsageHours of the hour added, deleted
    endpoints' included, written by the same transaction as they are
    (controlplane.endpoints.usage.record), so the capacity page's tenant table reads a few rows
    per tenant, however many endpoints the tenant has. Kept as long as the usage
    (USAGE_RETENTION_DAYS)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage_hours")
    start = models.BigIntegerField(help_text="unix seconds at the hour's start, a multiple of 3600")

    class Meta:
        ordering = ["tenant_id", "start"]
        constraints = [models.UniqueConstraint(fields=["tenant", "start"], name="tenant_usage_hour_unique")]
        indexes = [models.Index(fields=["start"])]

    def __str__(self) -> str:
        return f"tenant {self.tenant_id} hour from {self.start}"


class TenantUsageDay(UsageFigures):
    """One UTC day of a tenant's usage, written as its TenantUsageHours are: a week reads 7 of
    these and the hours at its ends, not 168 hours. Kept while any of its hours is."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="tenant_usage_days")
    start = models.BigIntegerField(help_text="unix seconds at the day's start (UTC), a multiple of 86400")

    class Meta:
        ordering = ["tenant_id", "start"]
        constraints = [models.UniqueConstraint(fields=["tenant", "start"], name="tenant_usage_day_unique")]
        indexes = [models.Index(fields=["start"])]

    def __str__(self) -> str:
        return f"tenant {self.tenant_id} day from {self.start}"


class DeletedEndpoint(models.Model):
    """A deleted endpoint's billing identity, written in the delete's transaction: routers keep
    metering the requests in flight at the delete and send their seconds after it (late ones
    too, held through an outage), and the collector bills those to this id, name and tenant
    (controlplane.endpoints.usage.record). Kept as long as its usage (USAGE_RETENTION_DAYS)."""

    endpoint_id = models.BigIntegerField(unique=True)
    name = models.CharField(max_length=63)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="deleted_endpoints")
    deleted_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-deleted_at"]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.name} (endpoint {self.endpoint_id}, deleted)"


class RouterSample(models.Model):
    """One router's row for one second, posted when there is no Redis (the embedded default).
    endpoint_id 0 marks the router's heartbeat for that second (no foreign key: a router may
    report an endpoint deleted a moment ago). A row is billed (added to usage) once, by the
    collector, whatever its age: ``billed`` says it was (a heartbeat has nothing to bill)."""

    second = models.BigIntegerField(db_index=True)
    endpoint_id = models.PositiveIntegerField()
    fields = models.JSONField(default=dict)
    router = models.CharField(max_length=80, default="")  # the posting router's id
    billed = models.BooleanField(default=False)

    class Meta:
        indexes = [
            models.Index(fields=["id"], condition=models.Q(billed=False), name="router_sample_unbilled")
        ]

    def __str__(self) -> str:
        return f"second {self.second} endpoint {self.endpoint_id}"


class RouterMark(models.Model):
    """The last second of each router taken into the database: stored (a posted second) or
    billed (from Redis's billing stream). A router sends its seconds in increasing order and
    moves on only once one is acknowledged, so a second at or below its router's mark is a
    retry of one already taken, and is skipped (dataplane.wire.load_samples). Kept as long as
    usage (USAGE_RETENTION_DAYS) after it last moved, however long the router is away: a
    second it took is older than that when it goes, and so is the hour it was billed to."""

    router = models.CharField(max_length=80, unique=True)
    second = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now, db_index=True)  # the sweep reads it every 5 s

    def __str__(self) -> str:
        return f"router {self.router} through {self.second}"

    @classmethod
    def take(cls, seconds: Iterable[tuple[str, int]], now: datetime) -> set[tuple[str, int]]:
        """The (router, second) pairs past their router's mark, the marks moved to the latest of
        them. Call it in the transaction that stores or bills them: the marks stay locked until
        it ends, so a retry racing its first attempt waits, then finds it taken (or not, if the
        first rolled back)."""
        by_router: dict[str, set[int]] = {}
        for router, second in seconds:
            by_router.setdefault(router, set()).add(second)
        if not by_router:
            return set()
        RouterMark.objects.bulk_create([RouterMark(router=r) for r in by_router], ignore_conflicts=True)
        taken, moved = set(), []
        # locked in one order, so two collectors that overlap wait for each other, never deadlock
        for mark in RouterMark.objects.select_for_update().filter(router__in=by_router).order_by("router"):
            new = {s for s in by_router[mark.router] if s > mark.second}
            if new:
                taken |= {(mark.router, s) for s in new}
                mark.second, mark.updated_at = max(new), now
                moved.append(mark)
        RouterMark.objects.bulk_update(moved, ["second", "updated_at"])
        return taken


class Lease(models.Model):
    """A named lease taken with a filtered update: one pass of each kind at a time (the
    collector's, the autoscaler's), fleet-wide, whatever the number of beat schedulers, workers
    or control-plane replicas. A worker that dies mid-pass holds it until it expires
    (LEASE_TTL_S), then the next pass takes it."""

    name = models.CharField(max_length=63, unique=True)
    holder = models.CharField(max_length=200, blank=True)
    expires_at = models.DateTimeField(null=True)
    last_run_at = models.DateTimeField(null=True)  # when the last pass under it finished
    # the pass's own progress: the last bucket end collected (the collector's), or judged (the
    # horizontal pass's calm history)
    cursor = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def take(cls, name: str, now: datetime, min_interval_s: float) -> "Lease | None":
        """The lease, when it is free and its last pass ended at least ``min_interval_s`` ago."""
        holder = f"{socket.gethostname()}:{os.getpid()}:{now.timestamp():.3f}"
        cls.objects.get_or_create(name=name)
        free = models.Q(expires_at__isnull=True) | models.Q(expires_at__lt=now)
        rested = models.Q(last_run_at__isnull=True) | models.Q(
            last_run_at__lte=now - timedelta(seconds=min_interval_s)
        )
        taken = (
            cls.objects.filter(name=name)
            .filter(free & rested)
            .update(holder=holder, expires_at=now + timedelta(seconds=LEASE_TTL_S))
        )
        return cls.objects.get(name=name) if taken else None

    def release(self, now: datetime, cursor: int | None = None) -> None:
        fields: dict[str, object] = {"expires_at": None, "last_run_at": now}
        if cursor is not None:
            fields["cursor"] = cursor
        Lease.objects.filter(pk=self.pk, holder=self.holder).update(**fields)
