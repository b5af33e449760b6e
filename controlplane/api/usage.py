"""GET /api/v1/usage/: what the routers metered, per endpoint and UTC hour or day.

A tenant sees its own endpoints' usage only, deleted endpoints' included (each row keeps its
endpoint's tenant); an operator sees every endpoint and may name a tenant. Another tenant's
endpoint id answers exactly as an id that does not exist: no rows. The sums are
controlplane.endpoints.usage's, the same as the console's endpoint page.
"""

from typing import Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import generics, permissions, serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.api.auth import request_principal
from controlplane.api.pagination import PageNumberPagination
from controlplane.api.params import MAX_ID
from controlplane.api.serializers import ExactNumberField, FastAnswer
from controlplane.endpoints import usage
from controlplane.endpoints.models import UsageHour


class UsageQuerySerializer(serializers.Serializer[Any]):
    """The query parameters; a bad one is a 400 naming it."""

    granularity = serializers.ChoiceField(
        choices=list(usage.STEP_S), default="hour", help_text="Periods of a UTC hour or a UTC day"
    )
    start = serializers.DateTimeField(
        required=False,
        help_text="ISO 8601 (UTC when no offset), floored to the period; default: 24 hours (by the"
        " hour) or 7 days (by the day) before the end. At most 31 days by the hour, 366 by the day.",
    )
    end = serializers.DateTimeField(
        required=False,
        help_text="ISO 8601, exclusive, rounded up to the period; default: now (the current period"
        " included).",
    )
    endpoint = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_ID, help_text="Only this endpoint (deleted ones too)"
    )
    tenant = serializers.CharField(
        required=False, max_length=63, help_text="Only this tenant's endpoints (operators)"
    )


class UsageSerializer(FastAnswer, serializers.Serializer[Any]):
    endpoint = serializers.IntegerField()
    endpoint_name = serializers.CharField()
    tenant = serializers.CharField()
    start = serializers.DateTimeField(source="start_time", help_text="The period's start (UTC)")
    end = serializers.DateTimeField(source="end_time", help_text="The period's end, exclusive")
    mu = ExactNumberField(help_text="Model units metered")
    requests = serializers.IntegerField(help_text="Requests answered by a pod")
    tokens_in = serializers.IntegerField(help_text="Prompt tokens")
    tokens_out = serializers.IntegerField(help_text="Generated tokens")
    throttled = serializers.IntegerField(help_text="Requests refused with a 429 (not in requests)")
    # The metaclass takes declared fields off the class, so Serializer.errors stays as it is.
    errors = serializers.IntegerField(help_text="5xx answers and upstream failures")  # type: ignore[assignment]


class UsagePagination(PageNumberPagination):
    # Rows are sums, not model rows: no late join by key.
    django_paginator_class = Paginator  # type: ignore[assignment]


class UsageView(generics.ListAPIView[Any]):
    """Usage per endpoint and period, oldest period first, then by endpoint id; only periods
    with usage are listed."""

    permission_classes = [permissions.IsAuthenticated]
    serializer_class = UsageSerializer
    pagination_class = UsagePagination
    filter_backends: list[Any] = []

    def get_queryset(self) -> QuerySet[Any]:
        return UsageHour.objects.none()  # list() asks controlplane.endpoints.usage

    @extend_schema(parameters=[UsageQuerySerializer])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        query = UsageQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        asked = query.validated_data
        try:
            w = usage.window(
                asked["granularity"],
                asked["start"].timestamp() if "start" in asked else None,
                asked["end"].timestamp() if "end" in asked else None,
                timezone.now().timestamp(),
            )
        except usage.UsageError as exc:
            raise ValidationError({exc.field: str(exc)}) from None
        filters: dict[str, Any] = {}
        if "endpoint" in asked:
            filters["endpoint_id"] = asked["endpoint"]
        if "tenant" in asked:
            filters["tenant__name"] = asked["tenant"]
        page = self.paginate_queryset(usage.usage(w, request_principal(request), **filters))
        rows = [usage.as_usage(r, w) for r in page or []]
        return self.get_paginated_response(UsageSerializer(rows, many=True).data)
