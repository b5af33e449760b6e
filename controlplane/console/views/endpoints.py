"""The endpoints section: the filtered list, the create/edit form (the API's serializer behind
it) and the detail page with its live panel of replicas, traffic and latency, and its usage."""

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import zip_longest
from typing import Any

from django.db import transaction
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone

from capacity.autoscaler.window import quantile
from capacity.ledger import AllowanceExceeded, Oversold, QuotaExceeded
from controlplane.api import params
from controlplane.api.filters import EndpointFilterSet
from controlplane.api.pagination import keyset_page
from controlplane.api.serializers import EndpointSerializer
from controlplane.capacity.models import GpuPool, GpuType, ModelProfile
from controlplane.console import charts
from controlplane.console.views.base import ConsoleRequest, console_view, filled, page
from controlplane.endpoints import timeline, usage
from controlplane.endpoints.models import Endpoint, LoadBucket
from controlplane.oncall.models import Event
from controlplane.oncall.templatetags.oncall import as_seen_by
from controlplane.selling import MoveRefused, NoPlacement
from controlplane.tenants.models import Tenant
from dataplane.wire.load_samples import LATENCY_BUCKETS_S

PAGE_SIZE = 50
# The list says how many endpoints match up to this many, and "more than" past it: a count
# that stops there costs the same whatever the fleet's size.
COUNT_UP_TO = 1000


@console_view(section="endpoints")
def endpoints(request: ConsoleRequest) -> HttpResponse:
    """Newest first, a page at a time through ?after=<id> (older) and ?before=<id> (newer): each
    page is one query bounded by the page (controlplane.api.pagination.keyset_page)."""
    visible = Endpoint.objects.visible_to(request.principal).with_related()
    query = filled(request.GET)
    filterset = EndpointFilterSet(query, queryset=visible)
    errors = dict(filterset.errors)
    cursors: dict[str, int] = {}
    for name in ("after", "before"):
        raw = query.get(name)
        if raw is not None:
            try:
                cursors[name] = params.object_id(name, raw)
            except params.ParameterError as exc:
                errors[name] = [exc.message]
    rows = visible.none() if errors else filterset.qs
    search = query.get("search", "")
    shown, newer, older = keyset_page(rows, cursors.get("after"), cursors.get("before"), PAGE_SIZE, search)
    for name in ("after", "before", "page"):  # the links carry the filters; "page" was the old pager's
        query.pop(name, None)
    context = {
        "endpoints": shown,
        "newer": shown[0].pk if newer else None,
        "older": shown[-1].pk if older else None,
        "matched": rows.order_by()[: COUNT_UP_TO + 1].count(),
        "count_up_to": COUNT_UP_TO,
        "errors": errors,
        "filterset": filterset,
        "query": query.urlencode(),
        "states": Endpoint.State.choices,
        "models": sorted(set(ModelProfile.objects.values_list("model", flat=True))),
        "gpu_types": GpuType.objects.values_list("name", flat=True),
    }
    response = page(request, "console/endpoints.html", "console/_endpoint_table.html", context)
    if errors:  # the table says which parameter, and why
        response.status_code = 400
    return response


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
            shown = str(refused) if request.principal.is_operator else refused.tenant_message()
            valid, errors = False, {"region_preference": shown}
        if valid:
            try:
                with transaction.atomic():
                    saved = serializer.save()
            except Oversold as refused:
                errors = {"pool": str(refused) if request.principal.is_operator else refused.tenant_message()}
            except QuotaExceeded as refused:
                errors = {"max_provisioned_concurrency": str(refused)}
            except AllowanceExceeded as refused:
                errors = {"min_provisioned_concurrency": str(refused)}
            except MoveRefused as refused:
                errors = {refused.field: str(refused)}
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
    context = endpoint_live_context(request, endpoint)
    # The API's usage query (/api/v1/usage/), every period shown: the last 24 hours, 7 days.
    now = timezone.now().timestamp()
    context["usage_hours"] = usage.series(endpoint, usage.window("hour", None, None, now))
    context["usage_days"] = usage.series(endpoint, usage.window("day", None, None, now))
    return page(request, "console/endpoint_detail.html", "console/_endpoint_live.html", context)


@console_view(section="endpoints")
def endpoint_live(request: ConsoleRequest, pk: int) -> HttpResponse:
    endpoint = get_object_or_404(Endpoint.objects.visible_to(request.principal).with_related(), pk=pk)
    return render(request, "console/_endpoint_live.html", endpoint_live_context(request, endpoint))


# Points a chart draws at most: its window's 5-second buckets are summed into bins this many
# to a window (an hour: 15-second bins), bins of a minute or more in whole minutes, read from
# the minutes rolled up (six hours: 2-minute bins, 180 points; a day: 6-minute bins).
CHART_POINTS = 240


def bin_width(window_s: int) -> int:
    """Seconds of a chart's bins: a multiple of the 5-second buckets, whole minutes from one."""
    width = window_s / CHART_POINTS
    return math.ceil(width / 60) * 60 if width >= 60 else max(5, int(width) // 5 * 5)


def endpoint_live_context(request: ConsoleRequest, endpoint: Endpoint) -> dict[str, Any]:
    """What the detail page refreshes: replicas, traffic, latency, pods and the window's timeline.

    The timeline is the autoscaler's 5-second load buckets (desired and ready replicas, requests
    in flight and per second, as the routers metered them), summed into bins, with each scale and
    concurrency event marked. Traffic and latency are the last minute's, and latency is read
    from the routers' histograms summed over the buckets (LoadBucket.latency_counts): 40
    requests under 0.25 s and 10 under 0.5 s put the p50 inside the first bucket. Bins of whole
    minutes read the minutes rolled up (controlplane.endpoints.timeline): the same sums."""
    window = charts.window_name(request.GET.get("window"))
    now = timezone.now()
    until = now.timestamp()
    since = until - charts.WINDOWS[window]
    width = bin_width(charts.WINDOWS[window])
    if width % 60 == 0:
        rows = timeline.chart_rows(endpoint, since, until)
    else:
        rows = list(
            LoadBucket.objects.filter(endpoint=endpoint, end__gt=since)
            .order_by("end")
            .values_list(*timeline.BUCKET_FIELDS)
        )
    marks = [
        charts.Mark(t.timestamp(), f"{t:%H:%M:%S} {k}: {as_seen_by(m, request.principal)}", f"mark {k}")
        for k, t, m in Event.objects.filter(
            endpoint=endpoint, kind__in=["scale", "concurrency"], time__gte=datetime.fromtimestamp(since, UTC)
        )
        .order_by("time", "id")
        .values_list("kind", "time", "message")
    ]
    bins = timeline_bins(rows, width)
    title = f"over the last {window}"
    # Each bin drawn at its end (the bin in progress at now); bins next to each other are one
    # width apart, so a bin without buckets (no router reported, or the endpoint had neither
    # replicas nor traffic) breaks the lines, and one without requests breaks the latency's.
    drawn = [(min(b.slot, until), b) for b in bins]
    replicas_chart = charts.Chart(
        title=f"replicas {title} (marks: scale and concurrency events)",
        series=[
            charts.Series("desired", [(t, b.desired) for t, b in drawn], "replicas", step=True, gap_s=width),
            charts.Series("ready", [(t, b.ready) for t, b in drawn], "used", step=True, gap_s=width),
        ],
        marks=marks,
        unit="replicas",
        whole=True,
        empty=f"No load recorded in the last {window}: the replicas show once the endpoint has a "
        "replica or traffic, within 5 seconds.",
    )
    load_chart = charts.Chart(
        title=f"load {title}: requests in flight (at pods and queued) and per second",
        series=[
            charts.Series("in flight", [(t, b.in_flight) for t, b in drawn], "sold", gap_s=width),
            charts.Series(
                "requests/s",
                [(t, b.requests / b.seconds) for t, b in drawn],
                "have",
                gap_s=width,
                unit="req/s",
            ),
        ],
        marks=marks,
        unit="req",
        empty=f"No load recorded in the last {window}: it shows once the endpoint has a replica "
        "or traffic, within 5 seconds.",
    )
    latency_chart = charts.Chart(
        title=f"latency {title}: p50 and p99 of the routers' histograms",
        series=[
            charts.Series(
                name, [(t, v) for t, b in drawn if (v := b.quantile(q)) is not None], css, gap_s=width
            )
            for name, q, css in (("p50", 0.5, "used"), ("p99", 0.99, "sold"))
        ],
        unit="s",
        empty=f"No requests in the last {window}: p50 and p99 show once the routers meter one, "
        "within 5 seconds.",
    )
    # One time axis for the page's three charts: their minutes line up.
    replicas, load, latency = charts.on_one_axis([replicas_chart, load_chart, latency_chart], since, until)
    # The last minute in one bin, whatever its buckets' slots (a bin of the width of all time).
    minute = timeline_bins([r for r in rows if r[0] > until - 60], float("inf"))
    last = minute[-1] if minute else None
    reservation = getattr(endpoint, "reservation", None)
    return {
        "endpoint": endpoint,
        "bounds": endpoint.replica_bounds,
        "reserved": reservation.mu_per_minute if reservation else 0,
        "requests_per_s": last.requests / last.seconds if last else None,
        "p50": last.quantile(0.5) if last else None,
        "p99": last.quantile(0.99) if last else None,
        "replicas_chart": replicas,
        "load_chart": load,
        "latency_chart": latency,
        "window": window,
        "windows": list(charts.WINDOWS),
        "events": Event.objects.filter(endpoint=endpoint).order_by("-id")[:10],
        "pods": pod_rows(request, endpoint, now),
        "show_urls": request.principal.is_operator,
    }


@dataclass
class TimelineBin:
    """Buckets summed over one bin of a chart: levels averaged by seconds, counts summed."""

    end: float  # unix seconds, the last bucket's end
    slot: int  # unix seconds, the bin's end (a multiple of its width)
    seconds: int = 0
    desired: float = 0.0  # the last bucket's, not an average: replicas are a level
    ready: float = 0.0
    in_flight_s: float = 0.0  # in-flight (at pods and queued) x seconds
    requests: int = 0
    latency_counts: list[int] = field(default_factory=list)

    @property
    def in_flight(self) -> float:
        return self.in_flight_s / self.seconds if self.seconds else 0.0

    def quantile(self, q: float) -> float | None:
        return quantile(self.latency_counts, LATENCY_BUCKETS_S, q) if self.latency_counts else None


def timeline_bins(rows: list[tuple[Any, ...]], width_s: float) -> list[TimelineBin]:
    """LoadBucket rows (end, desired, ready, in_flight, requests, seconds, queued, latency
    counts), ascending, summed into bins of `width_s` seconds (at least one bucket each; inf: all
    of them in one bin)."""
    width = max(5, int(width_s) // 5 * 5) if width_s != float("inf") else 0  # 0: one bin for all
    bins: list[TimelineBin] = []
    for end, desired, ready, in_flight, requests, seconds, queued, counts in rows:
        slot = -(-end // width) * width if width else 0  # the bin's end: buckets in (slot - width, slot]
        if not bins or bins[-1].slot != slot:
            bins.append(TimelineBin(end, slot))
        b = bins[-1]
        b.end, b.desired, b.ready = end, float(desired), float(ready)
        b.seconds += seconds
        b.in_flight_s += (in_flight + queued) * seconds
        b.requests += requests
        if counts:
            b.latency_counts = [a + c for a, c in zip_longest(b.latency_counts, counts, fillvalue=0)]
    return [b for b in bins if b.seconds]


def pod_rows(request: ConsoleRequest, endpoint: Endpoint, now: datetime) -> list[dict[str, Any]]:
    """The endpoint's pods with what the driver reports of each, and the newest event that names
    it that the viewer may see (a tenant sees its own pods' restarts and hangs)."""
    pods = list(endpoint.pods.order_by("name"))
    last: dict[str, Event] = {}
    for event in (
        Event.objects.visible_to(request.principal)
        .filter(pod__in=[p.name for p in pods])
        .order_by("-id")[: 20 * max(len(pods), 1)]
    ):
        last.setdefault(event.pod, event)
    return [
        {"pod": p, "age_s": (now - p.created_at).total_seconds(), "last_event": last.get(p.name)}
        for p in pods
    ]
