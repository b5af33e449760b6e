"""What every serializer of the API shares: strict input (a field a write does not take is a
400 naming it), answers made without DRF's per-field machinery, the principal asking, tenants by
name among those it may see, and ledger figures as exact JSON numbers."""

import datetime as dt
import difflib
import operator
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any, cast

from django.core.exceptions import ObjectDoesNotExist
from django.utils import timezone
from rest_framework import ISO_8601, serializers
from rest_framework.fields import SkipField
from rest_framework.relations import PKOnlyObject
from rest_framework.settings import api_settings

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


# For every serializer of the API (an endpoint's answer has its own, `endpoints.answer`): the
# answer DRF's Serializer.to_representation gives, each readable field read through a getter
# made once per serializer and time zone (an attribute chain, a related key's column) and, for
# the plain types, converted as DRF converts them, without DRF's per-field machinery (the chain
# walked and inspected for callables at every step, for every field of every row: a list of 100
# events or the 20 pools' ledgers spent most of their Python there). What the fast path does not
# take (a missing attribute, a callable, a mapping, a field that reads its own way or of another
# type) goes through the field's own get_attribute and to_representation: the answer is DRF's
# either way (tests/api/test_fast_answers.py). A comment, not a docstring: drf-spectacular would
# publish a serializer's first docstring, this one, as its schema's description.
class FastAnswer(_SerializerBase):
    def to_representation(self, instance: Any) -> dict[str, Any]:
        zone = timezone.get_current_timezone()  # a time's field writes it in the zone current then
        made = self.__dict__.get("_answer_steps")
        if made is None or made[0] is not zone:
            readable = [(name, field) for name, field in self.fields.items() if not field.write_only]
            made = self.__dict__["_answer_steps"] = (
                zone,
                [(name, field, *_fast_step(field)) for name, field in readable],
            )
        answer: dict[str, Any] = {}
        steps = made[1]
        for name, field, get, convert in steps:
            try:
                value = get(instance)
            except (AttributeError, KeyError, ObjectDoesNotExist):
                value = _SLOW
            if value is _SLOW or callable(value):  # DRF's own path, with its rules for these
                try:
                    value = field.get_attribute(instance)
                except SkipField:
                    continue
                if value is None or (isinstance(value, PKOnlyObject) and value.pk is None):
                    answer[name] = None
                else:
                    answer[name] = field.to_representation(value)
            elif value is None:
                answer[name] = None
            else:
                answer[name] = convert(value) if convert is not None else field.to_representation(value)
        return answer


_SLOW = object()


def _fast_step(field: Any) -> tuple[Callable[[Any], Any], Any]:
    """How FastAnswer reads `field` (a bound DRF field): a getter, and a conversion (None: the
    field's own)."""
    attrs, kind = field.source_attrs, type(field)
    if kind is serializers.PrimaryKeyRelatedField and field.pk_field is None and len(attrs) == 1:
        (attr,) = attrs
        # The key's column (DRF's PKOnlyObject), or the key of an instance a property gives.
        return (lambda instance: instance.serializable_value(attr)), lambda value: getattr(value, "pk", value)
    if kind is serializers.SlugRelatedField:  # the related row's slug, as DRF reads it
        return operator.attrgetter(".".join([*attrs, *field.slug_field.split("__")])), _itself
    if kind.get_attribute is not serializers.Field.get_attribute:  # a field that reads its own way
        return _slow, None
    if not attrs:  # source "*": the instance itself (a method field, a nested serializer)
        return _itself, None
    get = operator.attrgetter(".".join(attrs))
    if kind is serializers.BooleanField:
        return get, lambda value: value if type(value) is bool else field.to_representation(value)
    if kind is serializers.DateTimeField and _in_utc_iso(field):
        return get, lambda value: _iso_utc(value) or field.to_representation(value)
    return get, _CONVERSIONS.get(kind)


def _itself(value: Any) -> Any:
    return value


def _slow(instance: Any) -> Any:
    return _SLOW


def _in_utc_iso(field: serializers.DateTimeField) -> bool:
    """Whether the field writes times as ISO 8601 in UTC (DRF's default, under TIME_ZONE UTC)."""
    zone = field.timezone if hasattr(field, "timezone") else field.default_timezone()
    return getattr(field, "format", api_settings.DATETIME_FORMAT) == ISO_8601 and (
        zone is dt.UTC or getattr(zone, "key", None) == "UTC"
    )


def _iso_utc(value: Any) -> str | None:
    """An aware time at UTC's offset as DRF writes it in UTC (None for any other value): its wall
    time, which the move to UTC keeps, with Z."""
    if type(value) is dt.datetime and value.utcoffset() == dt.timedelta(0):
        return value.replace(tzinfo=None).isoformat() + "Z"
    return None


# DRF's own conversions of these types (IntegerField.to_representation is int(value), ...).
_CONVERSIONS: dict[type, Callable[[Any], Any]] = {
    serializers.IntegerField: int,
    serializers.CharField: str,
    serializers.FloatField: float,
    ExactNumberField: as_json_number,
}
