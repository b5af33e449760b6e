"""GPU types, pools, model-unit profiles, reservations (sold capacity), allowances of minimum
replicas beyond them, each pool's ledger as stored, and ledger snapshots with their hourly rollup.

Every write that can change what a pool holds goes through controlplane.selling, which locks the
pool rows, reads the ledger and refuses an oversell, then stores the pool's new ledger.
"""

import json
import math
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from capacity.ledger import PoolLedger, Shape
from capacity.packing import NodeShape
from capacity.units import DEFAULT_MAX_MODEL_LEN
from controlplane.tenants.models import Tenant, TenantScopedQuerySet, slug_validator


def validate_finite_non_negative(value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise ValidationError(f"must be a finite number >= 0, got {value}")


def validate_finite(value: float) -> None:
    if not math.isfinite(value):
        raise ValidationError(f"must be a finite number, got {value}")


class GpuType(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    memory_gib = models.PositiveIntegerField(help_text="GPU memory in GiB")
    hourly_cost_usd = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        validators=[MinValueValidator(0)],
        help_text="What one GPU costs per hour",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


def default_gpus_per_node(gpu_count: int) -> int:
    """A pool's node shape when none is given: the largest node of at most 8 GPUs (the common
    GPU server) that divides its GPUs: 16 -> 8 (2 nodes), 12 -> 6, 10 -> 5, 4 -> 4, 0 -> 8."""
    return max(d for d in range(1, 9) if gpu_count % d == 0)


class GpuPool(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="pools")
    region = models.CharField(max_length=63)
    cluster = models.CharField(max_length=63, blank=True)
    gpu_count = models.PositiveIntegerField(help_text="GPUs in the pool")
    # The pool is gpu_count / gpus_per_node nodes of one shape (gpu_count is a multiple of it):
    # a replica's GPUs are on one node (tensor parallelism), so the ledger packs replicas onto
    # these nodes (capacity.packing) instead of counting GPUs as one heap.
    # Unset on a new pool, it is default_gpus_per_node(gpu_count) when saved.
    gpus_per_node = models.PositiveSmallIntegerField(
        validators=[MinValueValidator(1)], help_text="GPUs on each node of the pool"
    )
    cpu_millicores_per_node = models.PositiveIntegerField(
        null=True, blank=True, help_text="CPU of each node in millicores (unset: not a limit)"
    )
    memory_mib_per_node = models.PositiveIntegerField(
        null=True, blank=True, help_text="Memory of each node in MiB (unset: not a limit)"
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                name="pool_gpus_per_node_positive", condition=models.Q(gpus_per_node__gte=1)
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.gpus_per_node is None:
            self.gpus_per_node = default_gpus_per_node(self.gpu_count)
        super().save(*args, **kwargs)

    @property
    def node_count(self) -> int:
        return self.gpu_count // self.gpus_per_node

    @property
    def node_shape(self) -> NodeShape:
        return NodeShape(self.gpus_per_node, self.cpu_millicores_per_node, self.memory_mib_per_node)


def sim_profile(gpu_type: str) -> str:
    """The simulated engine profile standing in for a GPU type (h100 unless named)."""
    from engine_model.profiles import PROFILES

    name = gpu_type.lower()
    return next((p for p in sorted(PROFILES) if p.split("-")[0] in name), "h100-llama-8b")


class ModelProfile(models.Model):
    """How one model is priced on one GPU type: cost = alpha*in + beta*out + gamma MU."""

    class Source(models.TextChoices):
        BENCHMARK = "benchmark"
        MANUAL = "manual"

    model = models.CharField(max_length=200)
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="profiles")
    alpha = models.FloatField(validators=[validate_finite_non_negative], help_text="MU per input token")
    beta = models.FloatField(validators=[validate_finite_non_negative], help_text="MU per output token")
    # >= -beta (checked below): a fitted line on the decoded tokens, beta * (out - 1) + gamma_d,
    # has gamma = gamma_d - beta (capacity.fitting), so one output token costs >= 0 beyond the prompt.
    gamma = models.FloatField(validators=[validate_finite], help_text="MU per request (>= -beta)")
    # Beyond the headline three (capacity.units): what long requests cost, 0 unless fitted.
    rho = models.FloatField(
        default=0.0,
        validators=[validate_finite_non_negative],
        help_text="MU per input token x log2(output tokens): prefill stalls under the latency SLO",
    )
    kappa = models.FloatField(
        default=0.0,
        validators=[validate_finite_non_negative],
        help_text="MU per KV token-step, output x (input + output / 2): KV-bound batches",
    )
    delta = models.FloatField(
        default=0.0,
        validators=[validate_finite_non_negative],
        help_text="MU per image token of a request (its vision encoder; capacity.units.image_tokens)",
    )
    cached_token_factor = models.FloatField(
        default=0.1,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Share of alpha a prompt token found in the prefix cache costs, measured by the benchmark",
    )
    # The simulated engine profile (engine_model.profiles) standing in for this model on
    # this GPU where no GPU can be had: benchmarks on a virtual clock and local pods run it.
    simulated_profile = models.CharField(
        max_length=100, blank=True, help_text="Simulated engine profile; empty: the GPU type's default"
    )
    mu_per_replica_minute = models.PositiveIntegerField(
        default=settings.MU_PER_REPLICA_MINUTE, validators=[MinValueValidator(1)]
    )
    gpus_per_replica = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    max_model_len = models.PositiveIntegerField(
        default=DEFAULT_MAX_MODEL_LEN,
        validators=[MinValueValidator(1)],
        help_text="Context length (prompt + output tokens) the engine serves; routers refuse more",
    )
    r2 = models.FloatField(null=True, blank=True, help_text="Fit quality, 1 is perfect")
    samples = models.PositiveIntegerField(null=True, blank=True, help_text="Shapes measured")
    fitted_at = models.DateTimeField(null=True, blank=True)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.MANUAL)
    heldout_mape = models.FloatField(null=True, blank=True, help_text="Held-out error of the fit, 0.05 = 5 %")
    engine = models.CharField(max_length=300, blank=True, help_text="What the current fit measured")
    engine_version = models.CharField(max_length=100, blank=True, help_text="Engine image/version measured")
    # Benchmark scheduling: one benchmark per profile at a time (claimed with a filtered update),
    # failures retried with backoff, operators may ask for a re-run.
    benchmark_requested_at = models.DateTimeField(null=True, blank=True)
    benchmark_claimed_at = models.DateTimeField(null=True, blank=True)
    benchmark_failures = models.PositiveIntegerField(default=0)  # failed or refused in a row: the streak
    benchmark_retry_at = models.DateTimeField(null=True, blank=True)
    # The one on-call event of the current streak (its count is updated, never repeated), and
    # whether the streak has paged (critical, once: the engine itself was unreachable).
    benchmark_streak_event_id = models.PositiveBigIntegerField(null=True, blank=True)
    benchmark_streak_paged = models.BooleanField(default=False)

    class Meta:
        ordering = ["model", "gpu_type__name"]
        constraints = [
            models.UniqueConstraint(fields=["model", "gpu_type"], name="one_profile_per_model_gpu"),
            models.CheckConstraint(
                name="profile_coefficients_non_negative",
                condition=models.Q(alpha__gte=0, beta__gte=0, gamma__gte=-models.F("beta")),
            ),
            models.CheckConstraint(
                name="profile_long_request_terms_non_negative",
                condition=models.Q(rho__gte=0, kappa__gte=0, delta__gte=0),
            ),
            models.CheckConstraint(
                name="profile_replica_shape_positive",
                condition=models.Q(mu_per_replica_minute__gte=1, gpus_per_replica__gte=1),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model} on {self.gpu_type}"

    @property
    def shape(self) -> Shape:
        return Shape(self.mu_per_replica_minute, self.gpus_per_replica)

    def engine_profile(self) -> str:
        """The simulated profile standing in for this pair: its own, else the GPU type's."""
        return self.simulated_profile or sim_profile(self.gpu_type.name)


class ProfileFit(models.Model):
    """One benchmark of a profile: the sweep, the fit and whether it was published (history)."""

    class Status(models.TextChoices):
        PUBLISHED = "published"  # became the profile's coefficients
        REFUSED = "refused"  # measured, but the fit was not good enough (or would oversell)
        FAILED = "failed"  # the engine failed; `reason` names the shape and the error

    profile = models.ForeignKey(ModelProfile, on_delete=models.CASCADE, related_name="fits")
    status = models.CharField(max_length=16, choices=Status.choices)
    reason = models.TextField(blank=True)
    alpha = models.FloatField(null=True, blank=True)
    beta = models.FloatField(null=True, blank=True)
    gamma = models.FloatField(null=True, blank=True)
    rho = models.FloatField(null=True, blank=True)
    kappa = models.FloatField(null=True, blank=True)
    delta = models.FloatField(null=True, blank=True)  # MU per image token; None: no image shapes
    cached_token_factor = models.FloatField(null=True, blank=True)  # None: no prefix shapes
    r2 = models.FloatField(null=True, blank=True)
    heldout_mape = models.FloatField(null=True, blank=True)
    samples = models.PositiveIntegerField(default=0)
    intervals = models.JSONField(default=dict, blank=True)  # {"alpha": [low, high], ...}
    shapes = models.JSONField(default=list, blank=True)  # per shape: in, out, req/min, cost, residual
    # images and the prefix cache (capacity.benchmark.extras), per term: {"delta": {"value",
    # "interval", "heldout_mape", "samples", "shapes": [...]}, "cached_token_factor": {...}}
    extras = models.JSONField(default=dict, blank=True)
    engine = models.CharField(max_length=300, blank=True)
    engine_version = models.CharField(max_length=100, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["profile", "-id"])]

    def __str__(self) -> str:
        return f"{self.profile_id} {self.status} at {self.finished_at:%Y-%m-%d %H:%M}"


class ReservationQuerySet(TenantScopedQuerySet["Reservation"]):
    tenant_field = "endpoint__tenant"


class Reservation(models.Model):
    """Capacity sold to the endpoint's tenant: MU per minute admitted before best-effort traffic."""

    # PROTECT: a sale outlives no delete silently, from the API, the admin or a tenant's
    # removal; selling.delete_endpoint ends it first, with its event, when an operator says so.
    endpoint = models.OneToOneField(
        "endpoints.Endpoint", on_delete=models.PROTECT, related_name="reservation"
    )
    mu_per_minute = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    # Whether the tenant may send more than it reserved while the endpoint has headroom.
    best_effort_allowed = models.BooleanField(default=True)
    sold_by = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ReservationQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(name="reservation_positive", condition=models.Q(mu_per_minute__gte=1)),
        ]
        # The largest first (the console's tenant table fills up with their tenants).
        indexes = [models.Index(fields=["-mu_per_minute", "id"], name="reservation_largest_first")]

    def __str__(self) -> str:
        return f"{self.mu_per_minute} MU/min on {self.endpoint_id}"


class ProvisionedAllowanceQuerySet(TenantScopedQuerySet["ProvisionedAllowance"]):
    """Tenants read their own allowances; operators every one."""


class ProvisionedAllowance(models.Model):
    """GPUs of minimum replicas beyond its reservations that a tenant may commit in one pool,
    set by an operator (controlplane.selling checks it). Without a row the tenant has the
    default, PROVISIONED_ALLOWANCE_DEFAULT_NODES of the pool's nodes."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="allowances")
    pool = models.ForeignKey(GpuPool, on_delete=models.CASCADE, related_name="allowances")
    gpus = models.PositiveIntegerField()
    set_by = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ProvisionedAllowanceQuerySet.as_manager()

    class Meta:
        ordering = ["tenant_id", "pool_id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "pool"], name="one_allowance_per_tenant_and_pool")
        ]

    def __str__(self) -> str:
        return f"{self.gpus} GPUs for tenant {self.tenant_id} in pool {self.pool_id}"


class JSONText(models.TextField):  # type: ignore[type-arg]  # generic in the stubs only
    """JSON kept as text, not as jsonb: for a value written whole and often, read whole, never
    queried into. A sale writes its pool's groups (tens of KB) every time, and PostgreSQL's
    parse of them into jsonb cost more than the rest of the row."""

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> Any:
        return None if value is None else json.loads(value)

    def to_python(self, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    def get_prep_value(self, value: Any) -> str | None:
        # allow_nan=False: what jsonb took, JSON itself (and the way back to jsonb) takes.
        return None if value is None else json.dumps(value, separators=(",", ":"), allow_nan=False)

    def value_to_string(self, obj: models.Model) -> Any:
        """The value itself, as JSONField gives it to dumpdata (not its printed form)."""
        return self.value_from_object(obj)

    def formfield(self, **kwargs: Any) -> Any:
        return super().formfield(**{"form_class": forms.JSONField, **kwargs})


class StoredLedger(models.Model):
    """A pool's ledger as the last write that changed it left it (controlplane.selling
    .refresh_ledgers): what the API, the console and every 409 read, so a read packs nothing.
    `version` counts the writes; `figures` is capacity.ledger.PoolLedger.figures(); `holders`
    the pool's endpoints that hold the most, most first: [endpoint id, committed GPUs,
    committed MU/min, running GPUs]. `groups` lets a sale check and store without reading the
    pool again, while the pool has no PoolMark and `digest` is as the profiles and the pool's
    rollouts in progress are now (pool_ledgers.digest_sql): its endpoints grouped as the ledger
    counts them (pool_ledgers.alike_groups, per group [what its replicas are counted from,
    [endpoints, metered MU, ready pods, the old version's ready pods]]); null and empty where
    none was taken (SQLite)."""

    pool = models.OneToOneField(
        GpuPool, on_delete=models.CASCADE, primary_key=True, related_name="stored_ledger"
    )
    version = models.PositiveBigIntegerField()
    computed_at = models.DateTimeField()
    figures = models.JSONField()
    holders = models.JSONField()
    groups = JSONText(null=True, blank=True)
    digest = models.CharField(max_length=80, blank=True, default="")

    def __str__(self) -> str:
        return f"pool {self.pool_id}'s ledger, version {self.version}"

    def ledger(self) -> PoolLedger:
        return PoolLedger.from_figures(self.figures)


class PoolMark(models.Model):
    """A write changed what one of the pool's endpoints' rows says it is counted from (its
    model, minimum, target, desired replicas, pool; the endpoint made or deleted) since its
    ledger was stored. Written by a PostgreSQL trigger on endpoints (endpoints migration 0024),
    whoever the writer: the ORM, the admin, SQL. Deleted by the writer that stores the pool's
    ledger, in the statement that reads the pool (pool_ledgers.groups_to_store). A sale takes
    the stored groups only while its pool has none."""

    pool = models.ForeignKey(GpuPool, on_delete=models.CASCADE, related_name="+")

    def __str__(self) -> str:
        return f"pool {self.pool_id} changed since its ledger was stored"


class CapacitySnapshot(models.Model):
    """A pool's ledger at one moment, for charts over time (written by a beat task, every minute,
    with its CapacityHour: controlplane.capacity.snapshots). Kept CAPACITY_SNAPSHOT_RETENTION_DAYS."""

    pool = models.ForeignKey(GpuPool, on_delete=models.CASCADE, related_name="snapshots")
    at = models.DateTimeField(default=timezone.now)
    have_gpus = models.FloatField()
    sold_gpus = models.FloatField()
    used_gpus = models.FloatField()
    have_mu_per_minute = models.FloatField()
    sold_mu_per_minute = models.FloatField()
    used_mu_per_minute = models.FloatField()

    class Meta:
        ordering = ["-at"]
        # (at): the charts read every pool's last minutes or hours, and the sweep deletes by age
        indexes = [models.Index(fields=["pool", "at"]), models.Index(fields=["at"])]

    def __str__(self) -> str:
        return f"{self.pool_id} at {self.at:%Y-%m-%d %H:%M}"


class CapacityHour(models.Model):
    """A pool's snapshots of one UTC hour, summed as they are written (in the snapshots'
    transaction: controlplane.capacity.snapshots.write), so a day or a week of charts and the
    forecast's four weeks read one row per pool and hour, not sixty: an hour of snapshots at
    100, 200 and 300 used MU/min holds 3 snapshots, used_mu_sum 600 (an average of 200) and
    used_mu_peak 300. Kept CAPACITY_HOUR_RETENTION_DAYS, longer than its snapshots."""

    pool = models.ForeignKey(GpuPool, on_delete=models.CASCADE, related_name="hours")
    start = models.BigIntegerField(help_text="unix seconds at the hour's start, a multiple of 3600")
    snapshots = models.PositiveIntegerField()  # how many the sums add up
    have_mu_sum = models.FloatField()  # have_mu_per_minute summed over the hour's snapshots
    sold_mu_sum = models.FloatField()
    used_mu_sum = models.FloatField()
    used_mu_peak = models.FloatField()  # the largest used_mu_per_minute of the hour

    class Meta:
        ordering = ["pool_id", "start"]
        constraints = [models.UniqueConstraint(fields=["pool", "start"], name="capacity_hour_unique")]
        indexes = [models.Index(fields=["start"])]

    def __str__(self) -> str:
        return f"{self.pool_id} hour from {self.start}"
