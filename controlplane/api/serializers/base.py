"""What every serializer of the API shares: strict input (a field a write does not take is a
400 naming it), the principal asking, tenants by name among those it may see, and ledger figures
as exact JSON numbers."""

import difflib
from collections.abc import Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any, cast

from rest_framework import serializers

from capacity.ledger import as_json_number
from controlplane.api.auth import request_principal
from controlplane.tenants.models import Principal, Tenant


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
