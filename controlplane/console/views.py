"""Console views: one model layer, the API's querysets, FilterSets and serializers behind them.

Each page renders its full template, or only its partial for htmx requests (`is_partial`).
Live parts poll: the endpoint detail every 5 s, the on-call tail every 2 s with a cursor.
"""

from collections import defaultdict
from datetime import timedelta
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Avg, Count, Max, Prefetch
from django.db.models.functions import TruncHour, TruncMinute
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from capacity.ledger import Oversold
from controlplane import selling
from controlplane.api.errors import oversold_body
from controlplane.api.filters import EndpointFilterSet, EventFilterSet
from controlplane.api.pagination import LateJoinPaginator
from controlplane.api.serializers import EndpointSerializer, ReservationSerializer
from controlplane.capacity.models import (
    CapacitySnapshot,
    GpuPool,
    GpuType,
    ModelProfile,
    ProfileFit,
    Reservation,
)
from controlplane.console import charts
from controlplane.endpoints.models import Endpoint, LoadBucket
from controlplane.oncall.models import Event
from controlplane.tenants.models import Tenant

WINDOWS = {  # name -> (length, bucket)
    "hour": (timedelta(hours=1), TruncMinute),
    "day": (timedelta(days=1), TruncHour),
    "week": (timedelta(days=7), TruncHour),
}
PAGE_SIZE = 50
TAIL_ROWS = 50


def is_partial(request) -> bool:
    return request.headers.get("HX-Request") == "true" and not request.headers.get(
        "HX-History-Restore-Request"
    )


def console_view(operator_only: bool = False, section: str = ""):
    """Signs in, finds the user's principal (tenant member or operator) and puts it on the request."""

    def decorate(view):
        @login_required
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            member = getattr(request.user, "member", None)
            if member is None:
                raise PermissionDenied("this user belongs to no tenant and is not an operator")
            request.principal = member.principal
            request.section = section
            if operator_only and not request.principal.is_operator:
                raise PermissionDenied("only operators may see this page")
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


def filled(query):
    """The query without empty values: a filter form's blank select means "any", not "''"."""
    params = query.copy()
    for key in list(params):
        values = [v for v in params.getlist(key) if v != ""]
        if values:
            params.setlist(key, values)
        else:
            del params[key]
    return params


def page(request, template: str, partial: str, context: dict) -> HttpResponse:
    return render(request, partial if is_partial(request) else template, context)


@console_view()
def home(request):
    return redirect("console:capacity" if request.principal.is_operator else "console:endpoints")


# --- Capacity ---------------------------------------------------------------------------------


@console_view(operator_only=True, section="capacity")
def capacity(request):
    return page(
        request,
        "console/capacity.html",
        "console/_capacity_pools.html",
        capacity_context(request.GET.get("window", "hour")),
    )


def capacity_context(window: str) -> dict:
    window = window if window in WINDOWS else "hour"
    now = timezone.now()
    pools = list(GpuPool.objects.select_related("gpu_type").order_by("gpu_type__name", "name"))
    ledgers = selling.pool_ledgers(pools)
    groups: dict[str, dict] = {}
    for pool in pools:
        ledger = ledgers[pool.pk]
        group = groups.setdefault(
            pool.gpu_type.name,
            {
                "gpu_type": pool.gpu_type,
                "pools": [],
                "have_gpus": 0,
                "sold_gpus": 0,
                "used_gpus": 0,
                "have_mu": 0,
                "sold_mu": 0,
                "used_mu": 0,
                "sellable_gpus": 0,
            },
        )
        group["pools"].append(
            {
                "pool": pool,
                "ledger": ledger,
                "bar": charts.capacity_bar(
                    float(ledger.have_gpus),
                    float(ledger.sellable_gpus),
                    float(ledger.sold_gpus),
                    float(ledger.used_gpus),
                ),
            }
        )
        for key, value in [
            ("have_gpus", ledger.have_gpus),
            ("sold_gpus", ledger.sold_gpus),
            ("used_gpus", ledger.used_gpus),
            ("sellable_gpus", ledger.sellable_gpus),
            ("have_mu", ledger.have_mu_per_minute),
            ("sold_mu", ledger.sold_mu_per_minute),
            ("used_mu", ledger.used_mu_per_minute),
        ]:
            group[key] += value
    for group in groups.values():
        group["bar"] = charts.capacity_bar(
            float(group["have_gpus"]),
            float(group["sellable_gpus"]),
            float(group["sold_gpus"]),
            float(group["used_gpus"]),
        )
        group["oversold"] = group["sold_gpus"] > group["sellable_gpus"]
    length, bucket = WINDOWS[window]
    since = now - length
    history: dict[str, dict[str, dict]] = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    rows = (
        CapacitySnapshot.objects.filter(at__gte=since)
        .annotate(bucket=bucket("at"))
        .values("pool__gpu_type__name", "pool_id", "bucket")
        .annotate(
            have=Avg("have_mu_per_minute"), sold=Avg("sold_mu_per_minute"), used=Avg("used_mu_per_minute")
        )
        .order_by()
    )
    for row in rows:  # average within a bucket per pool, then add the pools of a GPU type
        point = history[row["pool__gpu_type__name"]][row["bucket"]]
        for key in ("have", "sold", "used"):
            point[key] += row[key]
    for name, group in groups.items():
        buckets = sorted(history[name].items())
        group["chart"] = charts.line_chart(
            charts.Chart(
                title=f"{name}: MU/min over the last {window}",
                series=[
                    charts.Series(label, [(t.timestamp(), p[key]) for t, p in buckets], css)
                    for label, key, css in [
                        ("have", "have", "have"),
                        ("sold", "sold", "sold"),
                        ("used", "used", "used"),
                    ]
                ],
            ),
            since.timestamp(),
            now.timestamp(),
        )
    return {
        "groups": list(groups.values()),
        "profiles": profiles_with_history(),
        "window": window,
        "windows": list(WINDOWS),
        "overcommit": next(iter(ledgers.values())).overcommit if ledgers else 1,
    }


def profiles_with_history():
    """Profiles with their five latest benchmarks, in two queries."""
    recent = Prefetch("fits", queryset=ProfileFit.objects.order_by("-id")[:5], to_attr="recent_fits")
    return (
        ModelProfile.objects.select_related("gpu_type")
        .prefetch_related(recent)
        .order_by("model", "gpu_type__name")
    )


@require_POST
@console_view(operator_only=True, section="capacity")
def rerun_benchmark(request, pk):
    """The re-run button: ask for a benchmark; the next beat tick runs it."""
    ModelProfile.objects.filter(pk=pk).update(benchmark_requested_at=timezone.now(), benchmark_retry_at=None)
    profile = get_object_or_404(profiles_with_history(), pk=pk)
    return render(request, "console/_profile_row.html", {"p": profile})


@require_POST
@console_view(operator_only=True, section="capacity")
def sell(request):
    """Sell or change a reservation from the capacity page; an oversell shows its numbers."""
    form = {k: request.POST.get(k, "").strip() for k in ("endpoint", "mu_per_minute")}
    form["best_effort_allowed"] = request.POST.get("best_effort_allowed") == "on"
    tenant_name, _, endpoint_name = form["endpoint"].partition("/")
    endpoint = (
        Endpoint.objects.visible_to(request.principal)
        .with_related()
        .filter(tenant__name=tenant_name, name=endpoint_name)
        .first()
    )
    context = {"form": form, "errors": {}, "refused": None, "sold": None}
    if endpoint is None:
        context["errors"]["endpoint"] = f"no endpoint {form['endpoint']!r}: write it as tenant/endpoint"
        return render(request, "console/_sell_form.html", context, status=400)
    existing = Reservation.objects.filter(endpoint=endpoint).first()
    serializer = ReservationSerializer(
        existing,
        data={
            "endpoint": endpoint.pk,
            "mu_per_minute": form["mu_per_minute"],
            "best_effort_allowed": form["best_effort_allowed"],
        },
        context={"principal": request.principal},
    )
    if not serializer.is_valid():
        context["errors"] = {field: " ".join(map(str, errors)) for field, errors in serializer.errors.items()}
        return render(request, "console/_sell_form.html", context, status=400)
    try:
        with transaction.atomic():
            context["sold"] = serializer.save()
    except Oversold as refused:
        context["refused"] = oversold_body(refused)
        return render(request, "console/_sell_form.html", context, status=409)
    # The pools table is refreshed in the same response (out of band), with the new figures.
    context.update(capacity_context(request.POST.get("window", "hour")), refresh_pools=True)
    return render(request, "console/_sell_form.html", context)


# --- Endpoints --------------------------------------------------------------------------------


@console_view(section="endpoints")
def endpoints(request):
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
def endpoint_form(request, pk=None):
    """Create or edit an endpoint through the API's serializer: the same validation, one place."""
    endpoint = (
        get_object_or_404(Endpoint.objects.visible_to(request.principal).with_related(), pk=pk)
        if pk
        else None
    )
    errors = {}
    if request.method == "POST":
        data = {field: request.POST.get(field, "").strip() for field in ENDPOINT_FIELDS}
        data["scale_to_zero_enabled"] = request.POST.get("scale_to_zero_enabled") == "on"
        if request.principal.is_operator and not endpoint:
            data["tenant"] = request.POST.get("tenant", "")
        for optional in ("pool", "target_concurrency_per_replica"):
            if not data[optional]:
                data.pop(optional)
        serializer = EndpointSerializer(
            endpoint, data=data, partial=endpoint is not None, context={"principal": request.principal}
        )
        if serializer.is_valid():
            try:
                with transaction.atomic():
                    saved = serializer.save()
            except Oversold as refused:
                errors = {"pool": str(refused)}
            else:
                return redirect("console:endpoint", pk=saved.pk)
        else:
            errors = {field: " ".join(map(str, errs)) for field, errs in serializer.errors.items()}
        values = {**data, "tenant": request.POST.get("tenant", "")}
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
        "policies": Endpoint.Policy.choices,
        "tenants": Tenant.objects.values_list("name", flat=True) if request.principal.is_operator else [],
    }
    return render(request, "console/endpoint_form.html", context, status=400 if errors else 200)


@console_view(section="endpoints")
def endpoint_detail(request, pk):
    endpoint = get_object_or_404(Endpoint.objects.visible_to(request.principal).with_related(), pk=pk)
    context = endpoint_live_context(endpoint)
    context["pods"] = endpoint.pods.order_by("name")
    return page(request, "console/endpoint_detail.html", "console/_endpoint_live.html", context)


@console_view(section="endpoints")
def endpoint_live(request, pk):
    endpoint = get_object_or_404(Endpoint.objects.visible_to(request.principal).with_related(), pk=pk)
    return render(request, "console/_endpoint_live.html", endpoint_live_context(endpoint))


def endpoint_live_context(endpoint: Endpoint) -> dict:
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


# --- On-call ----------------------------------------------------------------------------------


def oncall_events(request):
    visible = Event.objects.visible_to(request.principal).select_related("tenant")
    filterset = EventFilterSet(filled(request.GET), queryset=visible)
    return filterset, (filterset.qs if filterset.is_valid() else visible.none())


@console_view(section="oncall")
def oncall(request):
    now = timezone.now()
    filterset, events = oncall_events(request)
    cursor = Event.objects.settled_cursor(now)
    query = filled(request.GET)
    query.pop("after", None)
    context = {
        "filterset": filterset,
        "events": events.filter(id__lte=cursor).order_by("-id")[:TAIL_ROWS],
        "cursor": cursor,
        "query": query.urlencode(),
        "kinds": Event.Kind.choices,
        "severities": Event.Severity.choices,
        "tenants": Tenant.objects.values_list("name", flat=True) if request.principal.is_operator else [],
        **attention(request, now),
    }
    return render(request, "console/oncall.html", context)


@console_view(section="oncall")
def oncall_tail(request):
    """New settled events after the cursor, newest first, with the next cursor (never misses nor repeats)."""
    now = timezone.now()
    try:
        after = int(request.GET.get("after", "0"))
    except ValueError:
        return HttpResponse(f"after must be an event id, got {request.GET.get('after')!r}", status=400)
    _, events = oncall_events(request)
    fresh = list(
        events.filter(pk__in=Event.objects.tail(after, now).values("pk")).order_by("-id")[:TAIL_ROWS]
    )
    newest = max([after, *[e.pk for e in fresh]])
    if len(fresh) == TAIL_ROWS:  # more arrived than a page: skip to the settled end, say so
        newest = max(newest, Event.objects.settled_cursor(now))
    query = filled(request.GET)
    query.pop("after", None)
    context = {"events": fresh, "cursor": newest, "query": query.urlencode()}
    if fresh:  # the attention panels change with new events; otherwise they refresh on their own
        context.update(attention(request, now))
    return render(request, "console/_oncall_tail.html", context)


@console_view(section="oncall")
def oncall_attention(request):
    """The attention and restarts panels: every 30 s, and at once after an acknowledgement."""
    return render(request, "console/_oncall_panels.html", attention(request, timezone.now()))


def attention(request, now) -> dict:
    """What on-call must see first: crash loops, endpoints that hang again and again, and
    critical events of the last day nobody has acknowledged."""
    visible = Event.objects.visible_to(request.principal)
    day = now - timedelta(days=1)
    return {
        "crash_loops": visible.filter(kind="crash_loop", time__gte=now - timedelta(hours=1))
        .values("pod", "endpoint_name")
        .annotate(n=Count("id"), last=Max("time"))
        .order_by("-last")[:10],
        "repeated_hangs": visible.filter(kind="hang", time__gte=day)
        .values("endpoint_id", "endpoint_name")
        .annotate(n=Count("id"), last=Max("time"))
        .filter(n__gte=2)
        .order_by("-n")[:10],
        "unacked_critical": visible.filter(
            severity="critical", acknowledged_at__isnull=True, time__gte=day
        ).count(),
        "restarts": visible.filter(kind="restart", time__gte=day)
        .exclude(pod="")
        .values("pod", "endpoint_name")
        .annotate(n=Count("id"), last=Max("time"))
        .order_by("-n", "-last")[:20],
    }


@require_POST
@console_view(section="oncall")
def acknowledge(request, pk):
    event = get_object_or_404(Event.objects.visible_to(request.principal), pk=pk)
    event.acknowledge(request.user.username, timezone.now())
    response = render(request, "console/_event_row.html", {"event": event})
    # Fired on receipt, while the button is still in the page: the attention panel refreshes.
    response["HX-Trigger"] = "event-acknowledged"
    return response
