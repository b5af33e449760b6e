"""FilterSets shared by the API and (later) the console's list views."""

import django_filters
from django.db.models import QuerySet
from django.utils import timezone

from controlplane.capacity.models import GpuPool, ModelProfile, Reservation
from controlplane.endpoints.models import Endpoint
from controlplane.oncall.models import Event


class EndpointFilterSet(django_filters.FilterSet):
    model = django_filters.CharFilter(field_name="profile__model")
    gpu_type = django_filters.CharFilter(field_name="pool__gpu_type__name")
    pool = django_filters.CharFilter(field_name="pool__name")
    tenant = django_filters.CharFilter(field_name="tenant__name")
    state = django_filters.MultipleChoiceFilter(choices=Endpoint.State.choices, distinct=False)
    search = django_filters.CharFilter(field_name="name", lookup_expr="icontains")

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


class ReservationFilterSet(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="endpoint__tenant__name")
    pool = django_filters.CharFilter(field_name="endpoint__pool__name")

    class Meta:
        model = Reservation
        fields = ["endpoint", "tenant", "pool"]


class EventFilterSet(django_filters.FilterSet):
    tenant = django_filters.CharFilter(field_name="tenant__name")
    kind = django_filters.MultipleChoiceFilter(choices=Event.Kind.choices, distinct=False)
    severity = django_filters.MultipleChoiceFilter(choices=Event.Severity.choices, distinct=False)
    since = django_filters.IsoDateTimeFilter(field_name="time", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="time", lookup_expr="lt")
    after = django_filters.NumberFilter(
        method="filter_after", label="A tail cursor: settled events after this id (see oncall.models)"
    )
    acknowledged = django_filters.BooleanFilter(
        field_name="acknowledged_at", lookup_expr="isnull", exclude=True
    )

    class Meta:
        model = Event
        fields = ["tenant", "endpoint", "pod", "kind", "severity", "since", "until", "after", "acknowledged"]

    # `value` (a Decimal) stays unannotated: drf-spectacular publishes that annotation as the type of
    # ?after= in the OpenAPI schema, which would change it from "number" to "number, double".
    def filter_after(  # type: ignore[no-untyped-def]
        self, queryset: QuerySet[Event], name: str, value
    ) -> QuerySet[Event]:
        return queryset.filter(pk__in=Event.objects.tail(int(value), timezone.now()).values("pk"))
