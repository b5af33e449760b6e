"""The on-call section: the live event tail (a cursor that never misses nor repeats), the
attention and restarts panels, and acknowledging an event."""

from datetime import datetime, timedelta
from typing import Any

from axes.models import AccessAttempt
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max, QuerySet, Sum
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from controlplane.api.filters import EventFilterSet
from controlplane.console.views.base import ConsoleRequest, console_view, filled
from controlplane.oncall.models import Event, may_acknowledge
from controlplane.tenants.models import Tenant

TAIL_ROWS = 50


def oncall_events(request: ConsoleRequest) -> tuple[EventFilterSet, QuerySet[Event]]:
    visible = Event.objects.visible_to(request.principal).select_related("tenant")
    filterset = EventFilterSet(filled(request.GET), queryset=visible, request=request)
    return filterset, (filterset.qs if filterset.is_valid() else visible.none())


@console_view(section="oncall")
def oncall(request: ConsoleRequest) -> HttpResponse:
    now = timezone.now()
    filterset, events = oncall_events(request)
    cursor = Event.objects.visible_to(request.principal).settled_cursor(now)  # no id the viewer may not see
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
        "may_acknowledge": may_acknowledge(request.principal),
        **attention(request, now),
    }
    return render(request, "console/oncall.html", context)


@console_view(section="oncall")
def oncall_tail(request: ConsoleRequest) -> HttpResponse:
    """New settled events after the cursor, newest first, with the next cursor (never misses nor repeats)."""
    now = timezone.now()
    try:
        after = int(request.GET.get("after", "0"))
    except ValueError:
        # htmx swaps a 400 into the page (base.html's responseHandling): what it echoes is escaped.
        return HttpResponse(
            format_html("after must be an event id, got {}", repr(request.GET.get("after"))), status=400
        )
    _, events = oncall_events(request)
    fresh = list(
        events.filter(pk__in=Event.objects.tail(after, now).values("pk")).order_by("-id")[:TAIL_ROWS]
    )
    newest = max([after, *[e.pk for e in fresh]])
    if len(fresh) == TAIL_ROWS:  # more arrived than a page: skip to the settled end, say so
        newest = max(newest, Event.objects.visible_to(request.principal).settled_cursor(now))
    query = filled(request.GET)
    query.pop("after", None)
    context = {
        "events": fresh,
        "cursor": newest,
        "query": query.urlencode(),
        "may_acknowledge": may_acknowledge(request.principal),
    }
    if fresh:  # the attention panels change with new events; otherwise they refresh on their own
        context.update(attention(request, now))
    return render(request, "console/_oncall_tail.html", context)


@console_view(section="oncall")
def oncall_attention(request: ConsoleRequest) -> HttpResponse:
    """The attention and restarts panels: every 30 s, and at once after an acknowledgement."""
    return render(request, "console/_oncall_panels.html", attention(request, timezone.now()))


def attention(request: ConsoleRequest, now: datetime) -> dict[str, Any]:
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
        "locked_sign_ins": locked_sign_ins(now) if request.principal.is_operator else [],
    }


def locked_sign_ins(now: datetime) -> list[dict[str, Any]]:
    """Usernames locked out of signing in now (django-axes: failures summed over every address,
    within the cool-off), for operators: who, how many failures, from how many addresses."""
    return list(
        AccessAttempt.objects.filter(attempt_time__gte=now - timedelta(hours=settings.AXES_COOLOFF_TIME))
        .values("username")
        .annotate(
            failures=Sum("failures_since_start"),
            addresses=Count("ip_address", distinct=True),
            last=Max("attempt_time"),
        )
        .filter(failures__gte=settings.AXES_FAILURE_LIMIT)
        .order_by("-last")[:10]
    )


@require_POST
@console_view(section="oncall")
def acknowledge(request: ConsoleRequest, pk: int) -> HttpResponse:
    if not may_acknowledge(request.principal):
        raise PermissionDenied("only operators may acknowledge events")
    event = get_object_or_404(Event.objects.visible_to(request.principal), pk=pk)
    event.acknowledge(request.user.username, timezone.now())
    response = render(request, "console/_event_row.html", {"event": event, "may_acknowledge": True})
    # Fired on receipt, while the button is still in the page: the attention panel refreshes.
    response["HX-Trigger"] = "event-acknowledged"
    return response
