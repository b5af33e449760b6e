"""The endpoints section: the filtered list, the create/edit form (the API's serializer behind
it) and the detail page with its live panel of replicas, traffic and latency, and its usage."""

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone

from capacity.ledger import Oversold, QuotaExceeded
from controlplane.api.filters import EndpointFilterSet
from controlplane.api.pagination import LateJoinPaginator
from controlplane.api.serializers import EndpointSerializer
from controlplane.capacity.models import GpuPool, GpuType, ModelProfile
from controlplane.console import charts
from controlplane.console.views.base import ConsoleRequest, console_view, filled, page
from controlplane.endpoints import usage
from controlplane.endpoints.models import Endpoint, LoadBucket
from controlplane.oncall.models import Event
from controlplane.selling import NoPlacement
from controlplane.tenants.models import Tenant

PAGE_SIZE = 50


@console_view(section="endpoints")
def endpoints(request: ConsoleRequest) -> HttpResponse:
    visible = Endpoint.objects.visible_to(request.principal).with_related()
    filterset = EndpointFilterSet(filled(request.GET), queryset=visible)
    rows = filterset.qs if filterset.is_valid() else visible.none()
    paginator = LateJoinPaginator(rows, PAGE_SIZE)
    query = filled(request.GET)
    query.pop("page", None)
    context = {
        "page": paginator.get_page(request.GET.get("page")),
        "filterset": filterset,
        "query": query.urlencode(),
        "states": Endpoint.State.choices,
        "models": sorted(set(ModelProfile.objects.values_list("model", flat=True))),
        "gpu_types": GpuType.objects.values_list("name", flat=True),
    }
    return page(request, "console/endpoints.html", "console/_endpoint_table.html", context)


# What the form posts: the API serializer's writable fields, less those the form handles itself.
ENDPOINT_FIELDS = [
    name
    for name, field in EndpointSerializer().fields.items()
    # Per-endpoint autoscaler settings and canary rollouts are API-only, not form fields (yet).
    if not field.read_only and name not in ("tenant", "scale_to_zero_enabled", "autoscaler", "canary_percent")
]


@console_view(section="endpoints")
def endpoint_form(request: ConsoleRequest, pk: int | None = None) -> HttpResponse:
    """Create or edit an endpoint through the API's serializer: the same validation, one place."""
    endpoint = (
        get_object_or_404(Endpoint.objects.visible_to(request.principal).with_related(), pk=pk)
        if pk
        else None
    )
    errors = {}
    if request.method == "POST":
        data: dict[str, str | bool] = {
            field: request.POST.get(field, "").strip() for field in ENDPOINT_FIELDS
        }
        data["scale_to_zero_enabled"] = request.POST.get("scale_to_zero_enabled") == "on"
        if request.principal.is_operator and not endpoint:
            data["tenant"] = request.POST.get("tenant", "")
        for optional in ("pool", "target_concurrency_per_replica"):
            if not data[optional]:
                data.pop(optional)
        serializer = EndpointSerializer(
            endpoint, data=data, partial=endpoint is not None, context={"principal": request.principal}
        )
        try:
            valid = serializer.is_valid()
        except NoPlacement as refused:  # placement runs in validation: it picks the pool
            valid, errors = False, {"region_preference": str(refused)}
        if valid:
            try:
                with transaction.atomic():
                    saved = serializer.save()
            except Oversold as refused:
                errors = {"pool": str(refused)}
            except QuotaExceeded as refused:
                errors = {"max_provisioned_concurrency": str(refused)}
            else:
                return redirect("console:endpoint", pk=saved.pk)
        elif not errors:
            errors = {field: " ".join(map(str, errs)) for field, errs in serializer.errors.items()}
        values: dict[str, Any] = {**data, "tenant": request.POST.get("tenant", "")}
    else:
        values = (
            EndpointSerializer(endpoint).data
            if endpoint
            else {
                "min_provisioned_concurrency": 0,
                "max_provisioned_concurrency": 16,
                "routing_policy": "p2c-mu",
            }
        )
    context = {
        "endpoint": endpoint,
        "values": values,
        "errors": errors,
        "models": sorted(set(ModelProfile.objects.values_list("model", flat=True))),
        "gpu_types": GpuType.objects.values_list("name", flat=True),
        "pools": GpuPool.objects.select_related("gpu_type").order_by("name"),
        "policies": Endpoint.RoutingPolicy.choices,
        "tenants": Tenant.objects.values_list("name", flat=True) if request.principal.is_operator else [],
    }
    return render(request, "console/endpoint_form.html", context, status=400 if errors else 200)


@console_view(section="endpoints")
def endpoint_detail(request: ConsoleRequest, pk: int) -> HttpResponse:
    endpoint = get_object_or_404(Endpoint.objects.visible_to(request.principal).with_related(), pk=pk)
    context = endpoint_live_context(endpoint)
    context["pods"] = endpoint.pods.order_by("name")
    # The API's usage query (/api/v1/usage/), every period shown: the last 24 hours, 7 days.
    now = timezone.now().timestamp()
    context["usage_hours"] = usage.series(endpoint, usage.window("hour", None, None, now))
    context["usage_days"] = usage.series(endpoint, usage.window("day", None, None, now))
    return page(request, "console/endpoint_detail.html", "console/_endpoint_live.html", context)


@console_view(section="endpoints")
def endpoint_live(request: ConsoleRequest, pk: int) -> HttpResponse:
    endpoint = get_object_or_404(Endpoint.objects.visible_to(request.principal).with_related(), pk=pk)
    return render(request, "console/_endpoint_live.html", endpoint_live_context(endpoint))


def endpoint_live_context(endpoint: Endpoint) -> dict[str, Any]:
    """What the detail page refreshes: replicas, traffic, latency and the last hour's timeline.

    The timeline is the autoscaler's 5-second load buckets (desired and ready replicas, requests
    in flight and per second, as the routers metered them), with each scale and concurrency
    event marked. Traffic and latency are the last minute's: p50 the requests-weighted mean of
    the buckets' p50, p99 the highest bucket p99 (a bucket's p99 is of its own requests).
    """
    now = timezone.now()
    since = now - timedelta(hours=1)
    rows = list(
        LoadBucket.objects.filter(endpoint=endpoint, end__gt=since.timestamp())
        .order_by("end")
        .values_list("end", "desired_replicas", "ready_replicas", "in_flight", "requests", "seconds",
                     "p50_latency_s", "p99_latency_s", "queued")
    )  # fmt: skip
    marks = [
        charts.Mark(t.timestamp(), f"{k}: {m}", f"mark {k}")
        for k, t, m in Event.objects.filter(
            endpoint=endpoint, kind__in=["scale", "concurrency"], time__gte=since
        )
        .order_by("time", "id")
        .values_list("kind", "time", "message")
    ]
    window = (since.timestamp(), now.timestamp())
    replicas = charts.line_chart(
        charts.Chart(
            title="replicas over the last hour (marks: scale and concurrency events)",
            series=[
                charts.Series("desired", [(r[0], float(r[1])) for r in rows], "replicas", step=True),
                charts.Series("ready", [(r[0], float(r[2])) for r in rows], "used", step=True),
            ],
            marks=marks,
        ),
        *window,
    )
    load = charts.line_chart(
        charts.Chart(
            title="load over the last hour: requests in flight (at pods and queued) and per second",
            series=[
                charts.Series("in flight", [(r[0], r[3] + r[8]) for r in rows], "sold"),
                charts.Series("requests/s", [(r[0], r[4] / r[5]) for r in rows], "have"),
            ],
            marks=marks,
        ),
        *window,
    )
    minute = [r for r in rows if r[0] > now.timestamp() - 60]
    served = sum(r[4] for r in minute)
    reservation = getattr(endpoint, "reservation", None)
    return {
        "endpoint": endpoint,
        "bounds": endpoint.replica_bounds,
        "reserved": reservation.mu_per_minute if reservation else 0,
        "requests_per_s": served / max(sum(r[5] for r in minute), 1) if minute else None,
        "p50": sum(r[4] * r[6] for r in minute if r[6] is not None) / served if served else None,
        "p99": max((r[7] for r in minute if r[7] is not None), default=None),
        "replicas_chart": replicas,
        "load_chart": load,
        "events": Event.objects.filter(endpoint=endpoint).order_by("-id")[:10],
    }
