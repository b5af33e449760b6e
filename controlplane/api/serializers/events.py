"""On-call events through the API: how a posted event is attributed, and what of one a tenant
reads (pods' addresses redacted, in its message and its detail)."""

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

from controlplane.api.serializers.base import FastAnswer, StrictInput, principal_of
from controlplane.endpoints.models import Endpoint, Pod
from controlplane.oncall.grouping import redact_addresses
from controlplane.oncall.models import Event, EventGroup
from controlplane.tenants.models import Tenant
from dataplane.wire import pod_events


class EventSerializer(FastAnswer, StrictInput, serializers.ModelSerializer[Event]):
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
