"""The capacity app's objects: GPU types, pools (their node shape), model profiles and their fits,
reservations and tenants' allowances; each write goes through controlplane.selling."""

import functools
from typing import Any, cast

from django.db.models import QuerySet
from rest_framework import serializers

from controlplane import pool_ledgers, selling, tenant_limits
from controlplane.api.serializers.base import FastAnswer, StrictInput, principal_of
from controlplane.capacity.models import (
    GpuPool,
    GpuType,
    ModelProfile,
    ProfileFit,
    ProvisionedAllowance,
    Reservation,
    default_gpus_per_node,
)
from controlplane.endpoints.models import Endpoint
from controlplane.tenants.models import Tenant

MAX_GPUS_PER_NODE = 64  # a sanity bound: no node of one shape holds more GPUs
# Every ledger read packs a pool node by node: a typo of 10**9 GPUs is refused, not packed.
MAX_NODES_PER_POOL = 10_000


class GpuTypeSerializer(FastAnswer, StrictInput, serializers.ModelSerializer[GpuType]):
    class Meta:
        model = GpuType
        fields = ["id", "name", "memory_gib", "hourly_cost_usd"]


class GpuPoolSerializer(FastAnswer, StrictInput, serializers.ModelSerializer[GpuPool]):
    gpu_type = serializers.SlugRelatedField(slug_field="name", queryset=GpuType.objects.all())
    gpus_per_node = serializers.IntegerField(
        min_value=1,
        max_value=MAX_GPUS_PER_NODE,
        required=False,
        help_text="GPUs on each node; gpu_count is a whole number of such nodes. A replica's GPUs"
        " are on one node. Default on create: the largest node of at most 8 GPUs that divides"
        " gpu_count (16 -> 8, 12 -> 6).",
    )
    node_count = serializers.IntegerField(read_only=True, help_text="gpu_count / gpus_per_node")

    class Meta:
        model = GpuPool
        fields = [
            "id", "name", "gpu_type", "region", "cluster", "gpu_count", "gpus_per_node", "node_count",
            "cpu_millicores_per_node", "memory_mib_per_node",
        ]  # fmt: skip

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        count = attrs.get("gpu_count", getattr(self.instance, "gpu_count", None))
        if count is None:
            return attrs  # reported as required
        per_node = attrs.get("gpus_per_node", getattr(self.instance, "gpus_per_node", None))
        if per_node is None:
            per_node = attrs["gpus_per_node"] = default_gpus_per_node(count)
        if count // per_node > MAX_NODES_PER_POOL:
            raise serializers.ValidationError(
                {
                    "gpu_count": f"gpu_count {count} at {per_node} GPUs per node is {count // per_node}"
                    f" nodes; a pool has at most {MAX_NODES_PER_POOL} (split it into pools)"
                }
            )
        if count % per_node:
            field = "gpus_per_node" if "gpus_per_node" in attrs else "gpu_count"
            raise serializers.ValidationError(
                {
                    field: f"gpu_count {count} is not a whole number of nodes of {per_node} GPUs"
                    f" (gpus_per_node); use a multiple of {per_node}, or another gpus_per_node"
                }
            )
        return attrs

    def validate_gpu_type(self, value: GpuType) -> GpuType:
        if self.instance and self.instance.gpu_type_id != value.pk and self.instance.endpoints.exists():
            raise serializers.ValidationError("cannot change the GPU type of a pool that has endpoints")
        return value

    def save(self, **kwargs: Any) -> GpuPool:
        pool = self.instance or GpuPool()
        for field, value in {**self.validated_data, **kwargs}.items():
            setattr(pool, field, value)
        selling.save_pool(pool)
        self.instance = pool
        return pool


class ProfileFitSerializer(FastAnswer, serializers.ModelSerializer[ProfileFit]):
    class Meta:
        model = ProfileFit
        fields = [
            "id",
            "status",
            "reason",
            "alpha",
            "beta",
            "gamma",
            "delta",
            "cached_token_factor",
            "r2",
            "heldout_mape",
            "samples",
            "intervals",
            "shapes",
            "extras",
            "engine",
            "engine_version",
            "started_at",
            "finished_at",
        ]


class ModelProfileSerializer(FastAnswer, StrictInput, serializers.ModelSerializer[ModelProfile]):
    gpu_type = serializers.SlugRelatedField(slug_field="name", queryset=GpuType.objects.all())

    class Meta:
        model = ModelProfile
        read_only_fields = [
            "heldout_mape",
            "engine",
            "engine_version",
            "benchmark_requested_at",
            "delta",
            "cached_token_factor",
        ]
        fields = [
            "id",
            "model",
            "gpu_type",
            "alpha",
            "beta",
            "gamma",
            "delta",
            "cached_token_factor",
            "mu_per_replica_minute",
            "gpus_per_replica",
            "max_model_len",
            "r2",
            "samples",
            "fitted_at",
            "source",
            "heldout_mape",
            "engine",
            "engine_version",
            "benchmark_requested_at",
        ]
        validators: list[
            Any
        ] = []  # the (model, gpu_type) clash is checked in validate() with a clear message

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        model = attrs.get("model", getattr(self.instance, "model", None))
        gpu_type = attrs.get("gpu_type", getattr(self.instance, "gpu_type", None))
        clash = ModelProfile.objects.filter(model=model, gpu_type=gpu_type)
        if self.instance:
            clash = clash.exclude(pk=self.instance.pk)
            if self.instance.endpoints.exists() and (
                model != self.instance.model or gpu_type != self.instance.gpu_type
            ):
                raise serializers.ValidationError(
                    {"model": "endpoints use this profile: its model and GPU type cannot change"}
                )
        if clash.exists():
            raise serializers.ValidationError(
                {"model": f"a profile for model {model!r} on {gpu_type} already exists"}
            )
        beta = attrs.get("beta", getattr(self.instance, "beta", 0.0))
        gamma = attrs.get("gamma", getattr(self.instance, "gamma", 0.0))
        if gamma is not None and beta is not None and gamma < -beta:
            raise serializers.ValidationError(
                {"gamma": f"must be >= -beta ({-beta:g}): a one-token answer costs >= 0, got {gamma:g}"}
            )
        return attrs

    def save(self, **kwargs: Any) -> ModelProfile:
        profile = self.instance or ModelProfile()
        for field, value in {**self.validated_data, **kwargs}.items():
            setattr(profile, field, value)
        selling.save_profile(profile)
        self.instance = profile
        return profile


class ReservationSerializer(FastAnswer, StrictInput, serializers.ModelSerializer[Reservation]):
    # What a sale reads of its endpoint (selling.sell; its rollout is read under the pool's
    # lock) and whether it has a reservation already: one statement.
    endpoint = serializers.PrimaryKeyRelatedField(
        queryset=Endpoint.objects.select_related("tenant", "profile", "reservation")
    )
    tenant = serializers.CharField(source="endpoint.tenant.name", read_only=True)
    replicas = serializers.SerializerMethodField(
        help_text="Whole replicas this reservation takes in its pool: ceil(MU/min / a replica's)"
    )
    gpus = serializers.SerializerMethodField(
        help_text="GPUs this reservation takes: replicas x gpus_per_replica"
    )

    class Meta:
        model = Reservation
        fields = [
            "id",
            "endpoint",
            "tenant",
            "mu_per_minute",
            "best_effort_allowed",
            "replicas",
            "gpus",
            "sold_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["sold_by", "created_at", "updated_at"]
        extra_kwargs = {"mu_per_minute": {"min_value": 1}}

    def get_replicas(self, reservation: Reservation) -> int:
        return reservation.endpoint.profile.shape.sold_replicas(
            reservation.mu_per_minute, pool_ledgers.overcommit()
        )

    def get_gpus(self, reservation: Reservation) -> int:
        return self.get_replicas(reservation) * reservation.endpoint.profile.gpus_per_replica

    def validate_endpoint(self, endpoint: Endpoint) -> Endpoint:
        if self.instance is not None and endpoint != self.instance.endpoint:
            raise serializers.ValidationError("a reservation cannot move to another endpoint")
        if self.instance is None and hasattr(endpoint, "reservation"):  # read with it, no query
            raise serializers.ValidationError(
                f"endpoint {endpoint.pk} already has a reservation; change it with PATCH"
            )
        return endpoint

    def save(self, **kwargs: Any) -> Reservation:
        # A create always names the endpoint (a required field); only an update may leave it out.
        endpoint = self.validated_data.get("endpoint") or cast(Reservation, self.instance).endpoint
        before = self.instance.mu_per_minute if self.instance else 0
        mu = self.validated_data.get("mu_per_minute", before)
        best_effort = self.validated_data.get(
            "best_effort_allowed", self.instance.best_effort_allowed if self.instance else True
        )
        self.instance = selling.sell(
            endpoint, mu_per_minute=mu, best_effort_allowed=best_effort, sold_by=principal_of(self).name
        )
        return self.instance


class ProvisionedAllowanceSerializer(
    FastAnswer, StrictInput, serializers.ModelSerializer[ProvisionedAllowance]
):
    """A tenant's allowance in a pool: GPUs of minimum replicas beyond its reservations it may
    commit there. Operators set it (one per tenant and pool; PATCH changes it); without one a
    tenant has PROVISIONED_ALLOWANCE_DEFAULT_NODES of the pool's nodes."""

    tenant = serializers.SlugRelatedField(slug_field="name", queryset=Tenant.objects.all())
    pool = serializers.SlugRelatedField(slug_field="name", queryset=GpuPool.objects.all())
    used_gpus = serializers.SerializerMethodField(
        help_text="GPUs its endpoints' minimum replicas take there beyond their reservations now"
    )

    class Meta:
        model = ProvisionedAllowance
        fields = ["id", "tenant", "pool", "gpus", "used_gpus", "set_by", "created_at", "updated_at"]
        read_only_fields = ["set_by", "created_at", "updated_at"]
        validators: list[Any] = []  # the (tenant, pool) clash is checked in validate() with a clear message

    def get_used_gpus(self, allowance: ProvisionedAllowance) -> int:
        return self._used[(allowance.tenant_id, allowance.pool_id)]

    @functools.cached_property
    def _used(self) -> dict[tuple[int, int], int]:
        """What every allowance shown (a list's rows share this serializer) has taken, read once."""
        shown = self.root.instance
        rows = list(shown) if isinstance(shown, list | QuerySet) else [cast(ProvisionedAllowance, shown)]
        return tenant_limits.unreserved(
            Endpoint.objects.filter(
                tenant_id__in={a.tenant_id for a in rows}, pool_id__in={a.pool_id for a in rows}
            )
        )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # Both are required on a create; an update keeps the row's unless it names them.
        tenant: Tenant = attrs.get("tenant") or cast(ProvisionedAllowance, self.instance).tenant
        pool: GpuPool = attrs.get("pool") or cast(ProvisionedAllowance, self.instance).pool
        if self.instance is not None and (tenant != self.instance.tenant or pool != self.instance.pool):
            raise serializers.ValidationError(
                {"pool": "an allowance stays with its tenant and pool; set another one for another pair"}
            )
        clash = ProvisionedAllowance.objects.filter(tenant=tenant, pool=pool)
        if self.instance is None and clash.exists():
            raise serializers.ValidationError(
                {
                    "pool": f"tenant {tenant.name!r} already has an allowance in pool {pool.name!r};"
                    f" change it with PATCH /api/v1/allowances/{clash.get().pk}/"
                }
            )
        return attrs

    def save(self, **kwargs: Any) -> ProvisionedAllowance:
        allowance = self.instance or ProvisionedAllowance()
        for field, value in {**self.validated_data, **kwargs}.items():
            setattr(allowance, field, value)
        self.instance = selling.save_allowance(allowance, set_by=principal_of(self).name)
        return self.instance
