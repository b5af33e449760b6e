"""FilterSets shared by the API and the console's list views.

One rule for filters that name an object by id (`?endpoint=7`): the choices are what the
principal may see (`visible_to`), so another tenant's endpoint is refused exactly as one that
does not exist ("Select a valid choice", a 400) and no id can be probed for existence. The
principal comes from the request the FilterSet is given: DRF's (its user is the Principal) or a
console request (its `principal`); without one, no object is a valid choice.
"""

from datetime import datetime
from typing import Any, cast

import django_filters
from django import forms
from django.db.models import Model, QuerySet
from django.utils import timezone
from django_filters.fields import IsoDateTimeField, ModelChoiceField

from controlplane.api import params
from controlplane.capacity.models import GpuPool, ModelProfile, ProvisionedAllowance, Reservation
from controlplane.endpoints.models import Endpoint, Pod
from controlplane.oncall.models import Event, EventGroup, EventQuerySet
from controlplane.tenants.models import Principal, TenantScopedQuerySet


def principal_of_request(request: Any) -> Principal | None:
    principal = getattr(request, "principal", None) or getattr(request, "user", None)
    return principal if isinstance(principal, Principal) else None


class IdField(forms.Field):
    """An id (controlplane.api.params): a whole number in the ids' column range, else invalid."""

    lowest = 1

    def to_python(self, value: Any) -> int | None:
        if value in self.empty_values:
            return None
        try:
            return params.integer("", str(value), lowest=self.lowest)
        except params.ParameterError as exc:
            raise forms.ValidationError(exc.message, code="invalid") from None


class CursorIdField(IdField):
    lowest = 0  # a tail starts at 0 (before every event)


class StrictBooleanField(forms.Field):
    """true or false (controlplane.api.params); a text input, so that what was sent reaches it
    (django-filter's boolean widget reads an unknown word as "any")."""

    def to_python(self, value: Any) -> bool | None:
        if value in self.empty_values:
            return None
        try:
            return params.boolean("", str(value))
        except params.ParameterError as exc:
            raise forms.ValidationError(exc.message, code="invalid") from None


class UtcDateTimeField(IsoDateTimeField):
    """ISO 8601 as an aware UTC datetime (controlplane.api.params): one that leaves the calendar
    once converted to UTC is invalid, not a database error."""

    def to_python(self, value: Any) -> datetime | None:
        if value in self.empty_values:
            return None
        try:
            return params.utc_datetime("", str(value))
        except params.ParameterError as exc:
            raise forms.ValidationError(exc.message, code="invalid") from None


class VisibleIdChoiceField(ModelChoiceField):
    """A model filter's choice: first an id (controlplane.api.params), then one the principal may
    see. An id past bigint names what is wrong; it leaks nothing, since no object has it."""

    def to_python(self, value: Any) -> Any:
        if value not in self.empty_values:
            try:
                params.object_id("", str(value))
            except params.ParameterError as exc:
                raise forms.ValidationError(exc.message, code="invalid") from None
        return super().to_python(value)


# NumberFilter and IsoDateTimeFilter underneath: the OpenAPI schema keeps their types.
class IdFilter(django_filters.NumberFilter):
    field_class = IdField


class CursorFilter(django_filters.NumberFilter):
    field_class = CursorIdField


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcDateTimeField


class StrictBooleanFilter(django_filters.BooleanFilter):
    field_class = StrictBooleanField


class ScopedFilterSet(django_filters.FilterSet):
    """Every choice of a model filter over a tenant-scoped model is limited to what the request's
    principal may see, and read as an id first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        principal = principal_of_request(self.request)
        for flt in self.filters.values():
            choices = getattr(flt, "queryset", None)
            if isinstance(choices, TenantScopedQuerySet):
                scoped: QuerySet[Model] = choices.visible_to(principal) if principal else choices.none()
                flt.queryset = scoped
            if isinstance(flt, django_filters.ModelChoiceFilter):  # each FilterSet's own copy
                flt.field_class = VisibleIdChoiceField


class EndpointFilterSet(django_filters.FilterSet):
    model = django_filters.CharFilter(field_name="profile__model")
    gpu_type = django_filters.CharFilter(field_name="pool__gpu_type__name")
    pool = django_filters.CharFilter(field_name="pool__name")
    tenant = django_filters.CharFilter(field_name="tenant__name")
    state = django_filters.MultipleChoiceFilter(choices=Endpoint.State.choices, distinct=False)
    search = django_filters.CharFilter(field_name="name", lookup_expr="icontains")
    scale_to_zero_enabled = StrictBooleanFilter()

    class Meta:
        model = Endpoint
        fields = ["model", "gpu_type", "pool", "tenant", "state", "scale_to_zero_enabled"]


class GpuPoolFilterSet(django_filters.FilterSet):
    gpu_type = django_filters.CharFilter(field_name="gpu_type__name")

    class Meta:
        model = GpuPool
        fields = ["gpu_type", "region", "cluster"]


class ModelProfileFilterSet(django_filters.FilterSet):
    gpu_type = django_filters.CharFilter(field_name="gpu_type__name")

    class Meta:
        model = ModelProfile
        fields = ["model", "gpu_type", "source"]


class ReservationFilterSet(ScopedFilterSet):
    tenant = django_filters.CharFilter(field_name="endpoint__tenant__name")
    pool = django_filters.CharFilter(field_name="endpoint__pool__name")

    class Meta:
        model = Reservation
        fields = ["endpoint", "tenant", "pool"]


class ProvisionedAllowanceFilterSet(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__name")
    pool = django_filters.CharFilter(field_name="pool__name")

    class Meta:
        model = ProvisionedAllowance
        fields = ["tenant", "pool"]


class PodFilterSet(ScopedFilterSet):
    ready = StrictBooleanFilter()

    class Meta:
        model = Pod
        fields = ["endpoint", "ready"]


class EventFilterSet(ScopedFilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__name")
    kind = django_filters.MultipleChoiceFilter(choices=Event.Kind.choices, distinct=False)
    severity = django_filters.MultipleChoiceFilter(choices=Event.Severity.choices, distinct=False)
    since = UtcDateTimeFilter(field_name="time", lookup_expr="gte")
    until = UtcDateTimeFilter(field_name="time", lookup_expr="lt")
    after = CursorFilter(
        method="filter_after", label="A tail cursor: settled events after this id (see oncall.models)"
    )
    acknowledged = StrictBooleanFilter(field_name="acknowledged_at", lookup_expr="isnull", exclude=True)
    group = IdFilter(field_name="group_id", label="The events of one on-call group")

    class Meta:
        model = Event
        fields = [
            "tenant",
            "endpoint",
            "pod",
            "kind",
            "severity",
            "since",
            "until",
            "after",
            "acknowledged",
            "group",
        ]

    # `value` (an int, IdField's) stays unannotated: drf-spectacular publishes that annotation as the type of
    # ?after= in the OpenAPI schema, which would change it from "number" to "number, double".
    def filter_after(  # type: ignore[no-untyped-def]
        self, queryset: QuerySet[Event], name: str, value
    ) -> QuerySet[Event]:
        return cast(EventQuerySet, queryset).tail(int(value), timezone.now())


class EventGroupFilterSet(ScopedFilterSet):
    """On-call's groups: by tenant, endpoint (a visible one), pod, kind, severity and state."""

    tenant = django_filters.CharFilter(field_name="tenant__name")
    kind = django_filters.MultipleChoiceFilter(choices=Event.Kind.choices, distinct=False)
    severity = django_filters.MultipleChoiceFilter(choices=Event.Severity.choices, distinct=False)
    state = django_filters.MultipleChoiceFilter(choices=EventGroup.State.choices, distinct=False)

    class Meta:
        model = EventGroup
        fields = ["tenant", "endpoint", "pod", "kind", "severity", "state"]
