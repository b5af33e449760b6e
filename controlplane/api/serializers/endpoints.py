"""Endpoints and their pods: what an endpoint's answer shows (its rollout, replica bounds,
reservation); its rules of ownership, profile and placement are controlplane.endpoint_rules."""

import functools
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers
from rest_framework.fields import SkipField

from capacity.provisioning import replica_bounds
from controlplane import autoscaler_config, endpoint_rules, selling
from controlplane.api.serializers.base import FastAnswer, StrictInput, VisibleTenantField, principal_of
from controlplane.capacity.models import GpuPool
from controlplane.endpoints.models import Endpoint, Pod, Rollout
from controlplane.tenants.models import Tenant
from dataplane.cluster import rollout as phases

# Where an endpoint's answer reads each of its keys, a Django lookup from the endpoint. A list
# reads its page of these as plain rows (`.values()`: one query and no model instance, where a
# page of 50 endpoints with their tenant, pool, profile and reservation built 330 of them), a
# single endpoint off its instance along the same paths; `answer` makes either into the API's
# answer, so a list's row and the endpoint's own answer are one format.
COLUMNS = {
    "id": "id",
    "tenant": "tenant__name",
    "name": "name",
    "served_model_name": "served_model_name",
    "model": "profile__model",
    "gpu_type": "profile__gpu_type__name",
    "pool": "pool__name",
    "region_preference": "region_preference",
    "min_provisioned_concurrency": "min_provisioned_concurrency",
    "max_provisioned_concurrency": "max_provisioned_concurrency",
    "scale_to_zero_enabled": "scale_to_zero_enabled",
    "target_concurrency_per_replica": "target_concurrency_per_replica",
    "routing_policy": "routing_policy",
    "autoscaler": "autoscaler",
    "version": "version",
    "desired_replicas": "desired_replicas",
    "ready_replicas": "ready_replicas",
    "state": "state",
    "reserved_mu_per_minute": "reservation__mu_per_minute",
    "used_mu_per_minute": "used_mu_per_minute",
    "created_at": "created_at",
    "updated_at": "updated_at",
}


def columns_of(endpoint: Endpoint) -> dict[str, Any]:
    """An endpoint's COLUMNS off its instance, as `.values()` reads them (None past a missing
    reservation)."""
    row = {}
    for path in COLUMNS.values():
        value: Any = endpoint
        for name in path.split("__"):  # no reservation: RelatedObjectDoesNotExist is an AttributeError
            value = getattr(value, name, None)
        row[path] = value
    return row


def answer(row: Mapping[str, Any], rollout: Rollout | None) -> dict[str, Any]:
    """The API's answer for an endpoint: its COLUMNS row and its rollout in progress. Times stay
    datetimes: the JSON renderer writes them as the declared fields would (ISO 8601, UTC as Z)."""
    lowest, highest = replica_bounds(
        row["min_provisioned_concurrency"],
        row["max_provisioned_concurrency"],
        row["target_concurrency_per_replica"],
        row["scale_to_zero_enabled"],
    )
    computed = {
        "rollout": rollout_answer(rollout, row["desired_replicas"]),
        "min_replicas": lowest,
        "max_replicas": highest,
        "reserved_mu_per_minute": row["reservation__mu_per_minute"] or 0,
    }
    return {key: computed[key] if key in computed else row[COLUMNS[key]] for key in answer_keys()}


def active_rollout(endpoint: Endpoint) -> Rollout | None:
    active = getattr(endpoint, "active_rollouts", None)
    if active is None:  # not loaded through with_related()
        active = list(Rollout.objects.active().filter(endpoint=endpoint)) if endpoint.pk else []
    return next(iter(active), None)


def rollout_answer(r: Rollout | None, desired_replicas: int) -> dict[str, Any] | None:
    if r is None:
        return None
    old, new = phases.split(r.state, desired_replicas)
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


class EndpointRows(serializers.ListSerializer[Any]):
    """A list's answers: plain COLUMNS rows (the API's list) with their rollouts in progress read
    in one query, or instances."""

    def to_representation(self, data: Any) -> list[dict[str, Any]]:
        rows = list(data)
        if not rows or not isinstance(rows[0], Mapping):
            return super().to_representation(rows)
        rolling: dict[int, Rollout] = {}
        for r in Rollout.objects.active().filter(endpoint_id__in=[row["id"] for row in rows]):
            rolling.setdefault(r.endpoint_id, r)  # the newest, as active_rollout takes it
        return [answer(row, rolling.get(row["id"])) for row in rows]


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
        list_serializer_class = EndpointRows

    def validate_autoscaler(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise serializers.ValidationError(f"{value!r} must be an object of setting: value")
        try:
            autoscaler_config.config_from_overrides(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value

    def to_representation(self, instance: Endpoint) -> dict[str, Any]:
        """`answer`. The declared fields say what a client may send and what the schema shows
        (the method fields below are theirs); a test holds the two to the same answer."""
        return answer(columns_of(instance), active_rollout(instance))

    def get_rollout(self, endpoint: Endpoint) -> dict[str, Any] | None:
        return rollout_answer(active_rollout(endpoint), endpoint.desired_replicas)

    def get_min_replicas(self, endpoint: Endpoint) -> int:
        return endpoint.replica_bounds[0]

    def get_max_replicas(self, endpoint: Endpoint) -> int:
        return endpoint.replica_bounds[1]

    def get_reserved_mu_per_minute(self, endpoint: Endpoint) -> int:
        reservation = getattr(endpoint, "reservation", None)
        return reservation.mu_per_minute if reservation else 0

    def to_internal_value(self, data: Any) -> Any:
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError as invalid:
            if not isinstance(invalid.detail, dict) or not isinstance(data, Mapping):
                raise  # a body that is not an object has no fields to check
            # validate() runs only when every field parses; the rules whose fields did parse are
            # checked all the same, so one answer names every error (a bad name and min > max).
            refused = endpoint_rules.refusals(
                principal_of(self), self.instance, self._parsed(data, invalid.detail), set(invalid.detail)
            )
            more = {field: [why] for field, why in refused.items() if field not in invalid.detail}
            raise serializers.ValidationError({**invalid.detail, **more}) from None

    def _parsed(self, data: Any, invalid: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of `data` that parse, by their API names (as validate() asks the rules)."""
        parsed: dict[str, Any] = {}
        for field in self._writable_fields:
            name = str(field.field_name)  # set once bound, as every field of a serializer is
            if name in invalid:
                continue
            try:
                parsed[name] = field.run_validation(field.get_value(data))
            except (serializers.ValidationError, DjangoValidationError, SkipField):
                continue  # not given, or refused: its rules are not checked
        return parsed

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """The endpoint's rules (controlplane.endpoint_rules): a refusal is a 400 by field."""
        profile_in = attrs.pop("profile", {})
        asked = dict(attrs)
        if "model" in profile_in:
            asked["model"] = profile_in["model"]
        if "gpu_type" in profile_in:
            asked["gpu_type"] = profile_in["gpu_type"]["name"]
        try:
            settled = endpoint_rules.settle(principal_of(self), self.instance, asked)
        except endpoint_rules.EndpointRefused as refused:
            raise serializers.ValidationError(refused.errors) from None
        attrs["tenant"], attrs["profile"] = settled.tenant, settled.profile
        if settled.pool is not None:
            attrs["pool"] = settled.pool
        return attrs

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


@functools.cache
def answer_keys() -> list[str]:
    """The answer's keys in the declared order, less those a client only sends."""
    return [name for name, field in EndpointSerializer().fields.items() if not field.write_only]


class PodSerializer(FastAnswer, StrictInput, serializers.ModelSerializer[Pod]):
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
