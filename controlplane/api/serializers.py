"""Serializers: names in, names out (GPU types, pools, tenants by name; endpoints by id)."""

import difflib
import functools
from collections.abc import Mapping
from datetime import timedelta
from fractions import Fraction
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.db.models import QuerySet
from rest_framework import serializers

from capacity.ledger import as_json_number
from capacity.provisioning import bounds_error, replica_bounds
from controlplane import pool_ledgers, scaling, selling, tenant_limits
from controlplane.api.auth import request_principal
from controlplane.capacity.models import (
    GpuPool,
    GpuType,
    ModelProfile,
    ProfileFit,
    ProvisionedAllowance,
    Reservation,
    default_gpus_per_node,
)
from controlplane.endpoints.models import Endpoint, Pod, Rollout
from controlplane.oncall.grouping import redact_addresses
from controlplane.oncall.models import Event, EventGroup
from controlplane.tenants.models import ApiKey, Principal, Tenant
from dataplane.cluster import rollout as phases
from dataplane.wire import pod_events

MAX_GPUS_PER_NODE = 64  # a sanity bound: no node of one shape holds more GPUs
# Every ledger read packs a pool node by node: a typo of 10**9 GPUs is refused, not packed.
MAX_NODES_PER_POOL = 10_000


class ExactNumberField(serializers.FloatField):
    """A ledger figure (an exact Fraction) as JSON: an integer when whole, else 6 decimals."""

    def to_representation(self, value: Fraction | float) -> float | int:  # type: ignore[override]
        # The stubs say a FloatField renders a str; DRF's renders a float, and this one an int too.
        return as_json_number(value)


if TYPE_CHECKING:
    _SerializerBase = serializers.Serializer[Any]
else:
    _SerializerBase = object


class StrictInput(_SerializerBase):
    """For every serializer that takes a write: a field it does not take, unknown or read-only
    (ids, what the control plane computes), is a 400 naming it beside the other fields' errors,
    never silently dropped, so a typo such as `max_provisioned_concurency` cannot pass.
    Nested input is checked by the nested serializer; JSON fields' contents are their own."""

    def to_internal_value(self, data: Any) -> Any:
        refused = refused_fields(self.fields, data)
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if refused and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**exc.detail, **refused}) from None
            raise
        if refused:
            raise serializers.ValidationError(refused)
        return value


def refused_fields(
    fields: Mapping[str, serializers.Field[Any, Any, Any, Any]], data: Any
) -> dict[str, list[str]]:
    """The keys of a write that name no writable field, each with why."""
    if not isinstance(data, Mapping):
        return {}  # DRF refuses a body that is not an object, naming its type
    writable = [name for name, field in fields.items() if not field.read_only]
    refused = {}
    for key in data:
        field = fields.get(key)
        if field is not None and field.read_only:
            refused[key] = ["read-only field"]
        elif field is None:
            near = difflib.get_close_matches(str(key), writable, n=1, cutoff=0.8)  # a typo, not a guess
            refused[key] = [f"unknown field; did you mean {near[0]!r}?" if near else "unknown field"]
    return refused


def principal_of(serializer: serializers.Serializer[Any]) -> Principal:
    """The API puts the Principal on request.user; the console passes it as `principal`."""
    return serializer.context.get("principal") or request_principal(serializer.context["request"])


class VisibleTenantField(serializers.SlugRelatedField):  # type: ignore[type-arg]
    """A tenant by name among those the principal may see: another tenant's name is refused as a
    name that does not exist, with the same message (existence does not leak)."""

    def get_queryset(self) -> Any:
        return Tenant.objects.visible_to(principal_of(cast(serializers.Serializer[Any], self.root)))


class TenantSerializer(StrictInput, serializers.ModelSerializer[Tenant]):
    class Meta:
        model = Tenant
        fields = ["id", "name", "display_name", "gpu_quota", "effective_gpu_quota", "created_at"]
        read_only_fields = ["created_at"]
        extra_kwargs = {
            "gpu_quota": {
                "help_text": "GPUs its endpoints may take at their minimum replicas, and at their"
                " maximum, each summed (both versions of a rollout); null: the default, the fleet's"
                " GPUs (at most TENANT_GPU_QUOTA_DEFAULT when set). Operators set it."
            }
        }

    effective_gpu_quota = serializers.SerializerMethodField()

    def get_effective_gpu_quota(self, tenant: Tenant) -> int:
        return tenant.gpu_quota if tenant.gpu_quota is not None else self._default_gpu_quota

    @functools.cached_property
    def _default_gpu_quota(self) -> int:
        """tenant_limits.default_gpu_quota, read once per list (a list's rows share this serializer)."""
        return tenant_limits.default_gpu_quota()


class ApiKeySerializer(StrictInput, serializers.ModelSerializer[ApiKey]):
    tenant = VisibleTenantField(
        slug_field="name", queryset=Tenant.objects.all(), required=False, allow_null=True
    )

    class Meta:
        model = ApiKey
        fields = ["id", "name", "tenant", "is_operator", "prefix", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = ["is_operator", "prefix", "created_at", "last_used_at", "revoked_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        principal = principal_of(self)
        if not principal.is_operator:
            if attrs.get("tenant") not in (None, principal.tenant):
                raise serializers.ValidationError({"tenant": "you can only make keys for your own tenant"})
            attrs["tenant"] = principal.tenant
        return attrs

    def create(self, validated_data: dict[str, Any]) -> ApiKey:
        key, secret = ApiKey.issue(name=validated_data["name"], tenant=validated_data.get("tenant"))
        # Shown once, in this response only: an attribute of this instance, never a model field.
        key.secret = secret  # type: ignore[attr-defined]
        return key

    def to_representation(self, instance: ApiKey) -> dict[str, Any]:
        data = super().to_representation(instance)
        if secret := getattr(instance, "secret", None):
            data["key"] = secret
        return data


class GpuTypeSerializer(StrictInput, serializers.ModelSerializer[GpuType]):
    class Meta:
        model = GpuType
        fields = ["id", "name", "memory_gib", "hourly_cost_usd"]


class GpuPoolSerializer(StrictInput, serializers.ModelSerializer[GpuPool]):
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


class ProfileFitSerializer(serializers.ModelSerializer[ProfileFit]):
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


class ModelProfileSerializer(StrictInput, serializers.ModelSerializer[ModelProfile]):
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


class EndpointSerializer(StrictInput, serializers.ModelSerializer[Endpoint]):
    tenant = VisibleTenantField(
        slug_field="name",
        queryset=Tenant.objects.all(),
        required=False,
        help_text="Operators name the tenant; a tenant's key always means its own tenant.",
    )
    model = serializers.CharField(source="profile.model", max_length=200)
    served_model_name = serializers.CharField(
        read_only=True,
        help_text="The model name its pods serve: the name it was created under, which a rename"
        " keeps (routers map the current name onto it, so a rename restarts no pod).",
    )
    gpu_type = serializers.CharField(source="profile.gpu_type.name", max_length=63)
    pool = serializers.SlugRelatedField(
        slug_field="name",
        queryset=GpuPool.objects.all(),
        required=False,
        help_text="Defaults to the pool of this GPU type (in region_preference, when set) where"
        " the most more replicas of the model fit.",
    )
    region_preference = serializers.RegexField(
        r"\A[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z",
        max_length=63,
        trim_whitespace=False,
        required=False,
        allow_blank=True,
        help_text="Run in this region: the roomiest pool there that places the endpoint's replicas,"
        " else 409 with what exists elsewhere. Blank: any region.",
        error_messages={"invalid": "a region is 1-63 lowercase letters, digits and '-' (as us-east-1)"},
    )
    target_concurrency_per_replica = serializers.IntegerField(
        min_value=1,
        max_value=4096,
        required=False,
        help_text="Concurrent requests per replica; the vertical autoscaler tunes it later.",
    )
    autoscaler = serializers.JSONField(
        required=False,
        help_text='Autoscaler settings over the defaults, e.g. {"target_utilisation": 0.6} '
        "(capacity.autoscaler.AutoscalerConfig lists every key, default and range; the cadences"
        " tick_s and vertical_tick_s are the control plane's, not per endpoint).",
    )
    canary_percent = serializers.IntegerField(
        min_value=0,
        max_value=99,
        required=False,
        write_only=True,
        help_text="With a new model: the new version takes this share of traffic and holds there "
        'until promoted (POST .../rollout/ {"action": "promote"}), at most ROLLOUT_MAX_HOLD_S, then'
        " it is aborted; 0 goes straight through. Each version runs and commits its share of the"
        " endpoint's replicas (at least one).",
    )
    rollout = serializers.SerializerMethodField(help_text="The rollout in progress, or null")
    min_replicas = serializers.SerializerMethodField()
    max_replicas = serializers.SerializerMethodField()
    reserved_mu_per_minute = serializers.SerializerMethodField()

    class Meta:
        model = Endpoint
        fields = [
            "id",
            "tenant",
            "name",
            "served_model_name",
            "model",
            "gpu_type",
            "pool",
            "region_preference",
            "min_provisioned_concurrency",
            "max_provisioned_concurrency",
            "scale_to_zero_enabled",
            "target_concurrency_per_replica",
            "routing_policy",
            "autoscaler",
            "version",
            "canary_percent",
            "rollout",
            "min_replicas",
            "max_replicas",
            "desired_replicas",
            "ready_replicas",
            "state",
            "reserved_mu_per_minute",
            "used_mu_per_minute",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [
            "version",
            "desired_replicas",
            "ready_replicas",
            "state",
            "used_mu_per_minute",
            "created_at",
            "updated_at",
        ]
        extra_kwargs = {"min_provisioned_concurrency": {"required": True}}
        validators: list[Any] = []  # the per-tenant name clash is checked in validate() with a clear message

    def validate_autoscaler(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise serializers.ValidationError(f"{value!r} must be an object of setting: value")
        try:
            scaling.config_from_overrides(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value

    def get_rollout(self, endpoint: Endpoint) -> dict[str, Any] | None:
        active = getattr(endpoint, "active_rollouts", None)
        if active is None:  # not loaded through with_related()
            active = list(Rollout.objects.active().filter(endpoint=endpoint)) if endpoint.pk else []
        r = next(iter(active), None)
        if r is None:
            return None
        old, new = phases.split(r.state, endpoint.desired_replicas)
        return {
            "from_version": r.from_version,
            "to_version": r.to_version,
            "phase": r.phase,
            "new_percent": r.new_percent,
            "canary_percent": r.canary_percent,
            "replicas": {str(r.from_version): old, str(r.to_version): new},
            "started_at": r.started_at,
            "hold_until": (
                r.phase_since + timedelta(seconds=settings.ROLLOUT_MAX_HOLD_S)
                if r.phase == phases.Phase.CANARY and not r.promoted
                else None
            ),
        }

    def get_min_replicas(self, endpoint: Endpoint) -> int:
        return endpoint.replica_bounds[0]

    def get_max_replicas(self, endpoint: Endpoint) -> int:
        return endpoint.replica_bounds[1]

    def get_reserved_mu_per_minute(self, endpoint: Endpoint) -> int:
        reservation = getattr(endpoint, "reservation", None)
        return reservation.mu_per_minute if reservation else 0

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        endpoint = self.instance
        principal = principal_of(self)
        errors: dict[str, str] = {}

        tenant = attrs.get("tenant")
        if endpoint is not None:
            if tenant is not None and tenant != endpoint.tenant:
                errors["tenant"] = "an endpoint cannot move to another tenant"
            tenant = endpoint.tenant
        elif not principal.is_operator:
            if tenant is not None and tenant != principal.tenant:
                errors["tenant"] = "you can only create endpoints for your own tenant"
            tenant = principal.tenant
        elif tenant is None:
            errors["tenant"] = "operators must name the tenant that owns the endpoint"
        attrs["tenant"] = tenant

        profile_in = attrs.pop("profile", {})
        model = profile_in.get("model", endpoint.profile.model if endpoint else None)
        gpu_name = profile_in.get("gpu_type", {}).get(
            "name", endpoint.profile.gpu_type.name if endpoint else None
        )
        gpu_type = GpuType.objects.filter(name=gpu_name).first()
        if gpu_type is None:
            known = ", ".join(GpuType.objects.values_list("name", flat=True)) or "none"
            errors["gpu_type"] = f"unknown GPU type {gpu_name!r} (known: {known})"
        else:
            profile = ModelProfile.objects.filter(model=model, gpu_type=gpu_type).first()
            if profile is None:
                known = ", ".join(gpu_type.profiles.values_list("model", flat=True)) or "none"
                errors["model"] = (
                    f"no model profile for {model!r} on {gpu_type.name} (profiled there: {known})"
                )
            else:
                attrs["profile"] = profile
                pool = attrs.get("pool")
                region = attrs.get("region_preference", getattr(endpoint, "region_preference", ""))
                moved_away = endpoint is not None and (
                    endpoint.pool.gpu_type_id != gpu_type.pk
                    or (region and "region_preference" in attrs and endpoint.pool.region != region)
                )
                if pool is None and (endpoint is None or moved_away):
                    pool = selling.place(profile, region, self._min_replicas(attrs))
                    if pool is None:
                        errors["gpu_type"] = f"no GPU pool holds {gpu_type.name} GPUs"
                    attrs["pool"] = pool
                elif pool is not None and pool.gpu_type_id != gpu_type.pk:
                    errors["pool"] = (
                        f"pool {pool.name!r} holds {pool.gpu_type.name} GPUs, not {gpu_type.name}"
                    )
                elif pool is not None and region and pool.region != region:
                    errors["pool"] = (
                        f"pool {pool.name!r} is in region {pool.region!r}, not the preferred {region!r}"
                    )

        low = attrs.get("min_provisioned_concurrency", getattr(endpoint, "min_provisioned_concurrency", 0))
        high = attrs.get("max_provisioned_concurrency", getattr(endpoint, "max_provisioned_concurrency", 1))
        bounds = bounds_error(low, high)
        if bounds:
            errors["min_provisioned_concurrency"] = bounds

        name = attrs.get("name", getattr(endpoint, "name", None))
        if tenant is not None and name is not None:
            clash = Endpoint.objects.filter(tenant=tenant, name=name)
            if endpoint is not None:
                clash = clash.exclude(pk=endpoint.pk)
            if clash.exists():
                errors["name"] = f"tenant {tenant.name!r} already has an endpoint named {name!r}"
        if errors:
            raise serializers.ValidationError(errors)
        return attrs

    def _min_replicas(self, attrs: dict[str, Any]) -> int:
        """The minimum replicas the endpoint will have: what its placement must fit."""
        endpoint = self.instance

        def value(name: str, default: Any) -> Any:
            return attrs.get(name, getattr(endpoint, name, default))

        low, high = value("min_provisioned_concurrency", 0), value("max_provisioned_concurrency", 1)
        if bounds_error(low, high):
            return 0  # reported with the bounds
        return replica_bounds(
            low,
            high,
            value("target_concurrency_per_replica", settings.DEFAULT_TARGET_CONCURRENCY),
            value("scale_to_zero_enabled", False),
        )[0]

    def save(self, **kwargs: Any) -> Endpoint:
        endpoint = self.instance or Endpoint(
            target_concurrency_per_replica=settings.DEFAULT_TARGET_CONCURRENCY
        )
        values = {**self.validated_data, **kwargs}
        for field, value in values.items():
            setattr(endpoint, field, value)
        selling.save_endpoint(
            endpoint,
            changed=values if self.instance is not None else None,
            by_operator=principal_of(self).is_operator,
        )
        endpoint.__dict__.pop("active_rollouts", None)  # prefetched before a rollout may have started
        self.instance = endpoint
        return endpoint


class PodSerializer(StrictInput, serializers.ModelSerializer[Pod]):
    endpoint = serializers.PrimaryKeyRelatedField(queryset=Endpoint.objects.all())

    class Meta:
        model = Pod
        fields = ["id", "endpoint", "name", "url", "ready", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]
        # Not required in the schema: a tenant's answers leave it out (``validate`` still wants it
        # to register a pod).
        extra_kwargs = {
            "url": {
                "required": False,
                "help_text": "Where the pod listens: operators only (absent for tenants)",
            }
        }

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if self.instance is None and "url" not in attrs:
            raise serializers.ValidationError({"url": [serializers.Field.default_error_messages["required"]]})
        return attrs

    def to_representation(self, instance: Pod) -> dict[str, Any]:
        data = super().to_representation(instance)
        if not principal_of(self).is_operator:  # a pod's address is the fleet's, never a tenant's
            del data["url"]
        return data


class ReservationSerializer(StrictInput, serializers.ModelSerializer[Reservation]):
    endpoint = serializers.PrimaryKeyRelatedField(queryset=Endpoint.objects.with_related())
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
        if self.instance is None and Reservation.objects.filter(endpoint=endpoint).exists():
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


class ProvisionedAllowanceSerializer(StrictInput, serializers.ModelSerializer[ProvisionedAllowance]):
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


class EventSerializer(StrictInput, serializers.ModelSerializer[Event]):
    """Events as the pods post them (dataplane.wire.pod_events) and on-call reads them.

    Attribution: the endpoint decides the tenant (a tenant that is not the endpoint's is a 400);
    an event that names only a registered pod is attributed to the pod's endpoint and version.
    Tenants read their own events with the pods' addresses redacted (they are the fleet's)."""

    tenant = serializers.SlugRelatedField(
        slug_field="name", queryset=Tenant.objects.all(), required=False, allow_null=True
    )
    endpoint = serializers.PrimaryKeyRelatedField(
        queryset=Endpoint.objects.select_related("tenant"), required=False, allow_null=True
    )
    version = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    group: serializers.PrimaryKeyRelatedField[EventGroup] = serializers.PrimaryKeyRelatedField(read_only=True)

    class Meta:
        model = Event
        # What a pod posts (its keys are the wire contract's), then what the control plane adds.
        fields = [
            "id",
            *pod_events.FIELDS,
            "endpoint_name",
            "group",
            "recorded_at",
            "reported_by",
            "acknowledged_at",
            "acknowledged_by",
        ]
        read_only_fields = [
            "endpoint_name",
            "recorded_at",
            "reported_by",
            "acknowledged_at",
            "acknowledged_by",
        ]

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("tenant") == "":
            data = {**data, "tenant": None}  # the wire's "not known"
        return super().to_internal_value(data)

    def validate_detail(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be a JSON object")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        endpoint, tenant = attrs.get("endpoint"), attrs.get("tenant")
        if endpoint is None and attrs.get("pod"):
            pod = Pod.objects.select_related("endpoint__tenant").filter(name=attrs["pod"]).first()
            if pod is not None:
                endpoint = attrs["endpoint"] = pod.endpoint
                if attrs.get("version") is None:
                    attrs["version"] = pod.version or pod.endpoint.version
        if endpoint is not None:
            if tenant is not None and tenant.pk != endpoint.tenant_id:
                raise serializers.ValidationError(
                    {"tenant": [f"{tenant.name!r} is not the tenant of endpoint {endpoint.pk}"]}
                )
            attrs["tenant"] = endpoint.tenant
        return attrs

    def to_representation(self, instance: Event) -> dict[str, Any]:
        data = super().to_representation(instance)
        if not principal_of(self).is_operator:
            data["message"] = redact_addresses(data["message"])
            data["detail"] = redact_detail(data["detail"])
        return data

    def create(self, validated_data: dict[str, Any]) -> Event:
        return Event.record(
            validated_data.pop("kind"),
            validated_data.pop("message"),
            reported_by=principal_of(self).name,
            **validated_data,
        )


def redact_detail(value: Any) -> Any:
    """An event's detail as a tenant may read it: every string with addresses redacted."""
    if isinstance(value, str):
        return redact_addresses(value)
    if isinstance(value, dict):
        return {k: redact_detail(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_detail(v) for v in value]
    return value


class ModelCapacitySerializer(serializers.Serializer[Any]):
    model = serializers.CharField()
    gpus_per_replica = serializers.IntegerField(source="shape.gpus_per_replica")
    mu_per_replica_minute = serializers.IntegerField(source="shape.mu_per_replica_minute")
    have_replicas = serializers.IntegerField(help_text="If the whole pool ran only this model")
    more_replicas = serializers.IntegerField(help_text="Replicas of it that still fit on the nodes")
    have_mu_per_minute = ExactNumberField(help_text="have_replicas x mu_per_replica_minute")
    headroom_mu_per_minute = ExactNumberField(
        help_text="more_replicas x mu_per_replica_minute x over-commit: what could still be sold of it"
    )


class PlacedReplicaSerializer(serializers.Serializer[Any]):
    endpoint_id = serializers.SerializerMethodField()
    endpoint = serializers.CharField(
        source="label", help_text="tenant/endpoint (and its version, while a rollout runs: both are placed)"
    )
    model = serializers.CharField()
    gpus = serializers.IntegerField()

    def get_endpoint_id(self, replica: Any) -> int:
        return pool_ledgers.endpoint_of_key(replica.key)


class NodeUseSerializer(serializers.Serializer[Any]):
    index = serializers.IntegerField()
    gpus = serializers.IntegerField()
    free_gpus = serializers.IntegerField()
    replicas = PlacedReplicaSerializer(many=True)


class PoolCapacitySerializer(serializers.Serializer[Any]):
    """One pool's ledger (capacity.ledger.PoolLedger) beside the pool it describes."""

    id = serializers.IntegerField(source="pool.pk")
    pool = serializers.CharField(source="pool.name")
    gpu_type = serializers.CharField(source="pool.gpu_type.name")
    region = serializers.CharField(source="pool.region")
    cluster = serializers.CharField(source="pool.cluster")
    node_count = serializers.IntegerField(source="ledger.node_count")
    gpus_per_node = serializers.IntegerField(source="ledger.gpus_per_node")
    overcommit = ExactNumberField(source="ledger.overcommit")
    have_gpus = serializers.IntegerField(source="ledger.have_gpus")
    sellable_gpus = ExactNumberField(source="ledger.sellable_gpus")
    committed_replicas = serializers.IntegerField(
        source="ledger.committed_replicas",
        help_text="Per endpoint the larger of its sold replicas and its minimum replicas, summed;"
        " while a rollout runs, each version's share of the larger of that and its desired replicas",
    )
    committed_gpus = ExactNumberField(source="ledger.committed_gpus")
    sold_replicas = serializers.IntegerField(
        source="ledger.sold_replicas", help_text="Per endpoint ceil(reserved MU/min / a replica's)"
    )
    sold_gpus = ExactNumberField(source="ledger.sold_gpus")
    used_gpus = ExactNumberField(
        source="ledger.used_gpus", help_text="Held by running replicas: ready pods x gpus_per_replica"
    )
    free_gpus = serializers.IntegerField(source="ledger.free_gpus", help_text="Left free by the packing")
    stranded_gpus = serializers.IntegerField(
        source="ledger.stranded_gpus", help_text="Free GPUs no replica of a model placed here can use"
    )
    headroom_gpus = ExactNumberField(source="ledger.headroom_gpus", help_text="free_gpus - stranded_gpus")
    unplaced_replicas = serializers.IntegerField(source="ledger.unplaced_replicas")
    have_mu_per_minute = ExactNumberField(source="ledger.have_mu_per_minute")
    sellable_mu_per_minute = ExactNumberField(source="ledger.sellable_mu_per_minute")
    committed_mu_per_minute = ExactNumberField(source="ledger.committed_mu_per_minute")
    sold_mu_per_minute = ExactNumberField(source="ledger.sold_mu_per_minute")
    used_mu_per_minute = ExactNumberField(source="ledger.used_mu_per_minute", help_text="Metered")
    headroom_mu_per_minute = ExactNumberField(source="ledger.headroom_mu_per_minute")
    oversold = serializers.BooleanField(source="ledger.oversold")
    models = ModelCapacitySerializer(source="ledger.models", many=True)
    version = serializers.IntegerField(
        source="stored.version", help_text="The pool's stored ledger: one more for each write that changed it"
    )
    computed_at = serializers.DateTimeField(source="stored.computed_at")


class PoolNodesSerializer(PoolCapacitySerializer):
    """A pool's ledger with its placement (?nodes=true): read and packed live."""

    nodes = NodeUseSerializer(source="ledger.nodes", many=True, help_text="Which replica occupies what")
