"""The on-call section: problems folded into groups (the default view: warning and critical,
open first, each with its count, first and last time, a sparkline of its last 24 h and a link to
its kind's runbook), acknowledged, resolved and silenced by operators; the live event tail (a
cursor that never misses nor repeats) as the second view (`?view=events`); the attention panel
(the embedded stack's own processes that died among what it counts) and the restarts per replica
slot; and the runbooks (docs/runbooks/<kind>.md)."""

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from axes.models import AccessAttempt
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max, QuerySet, Sum
from django.db.models.functions import Trunc
from django.http import Http404, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from controlplane.api import params
from controlplane.api.filters import EventFilterSet, EventGroupFilterSet
from controlplane.console.views.base import ConsoleRequest, console_view, filled, refused_parameters
from controlplane.oncall import grouping, stack
from controlplane.oncall.models import Event, EventGroup, EventQuerySet, may_acknowledge

TAIL_ROWS = 50
GROUP_ROWS = 50
# The most events each attention panel reads: the newest of its kind in its window.
ATTENTION_EVENTS = 1000
SPARK_HOURS = 24
DEFAULT_SEVERITIES = ["warning", "critical"]
# How long a silence may last, minutes -> label (the form's choices; anything else is refused).
SILENCE_CHOICES = {15: "15 min", 60: "1 h", 240: "4 h", 1440: "1 day", 10080: "1 week"}
RUNBOOKS = Path(settings.BASE_DIR) / "docs" / "runbooks"


def oncall_events(request: ConsoleRequest) -> tuple[EventFilterSet, EventQuerySet]:
    visible = Event.objects.visible_to(request.principal).select_related("tenant")
    filterset = EventFilterSet(filled(request.GET), queryset=visible, request=request)
    return filterset, (filterset.qs if filterset.is_valid() else visible.none())


def group_query(request: ConsoleRequest) -> QueryDict:
    """The groups view's filters: warning and critical unless a severity is asked for ("any": all)."""
    query = filled(request.GET)
    for key in ("view", "after"):
        query.pop(key, None)
    severities = query.getlist("severity")
    if not severities:
        query.setlist("severity", DEFAULT_SEVERITIES)
    elif "any" in severities:
        query.pop("severity")
    return query


def oncall_groups(request: ConsoleRequest, now: datetime) -> dict[str, Any]:
    """The groups the viewer may see under the filters, open first, each with its sparkline."""
    query = group_query(request)
    visible = EventGroup.objects.visible_to(request.principal).select_related("tenant")
    filterset = EventGroupFilterSet(query, queryset=visible, request=request)
    groups: list[Any] = []  # EventGroups, each given its sparkline below
    if filterset.is_valid():
        # Each part is an index scan in on-call order (EventGroup.Meta) that stops with the page.
        chosen = filterset.qs.on_call_order()
        if states := filterset.form.cleaned_data.get("state"):
            groups = list(chosen.in_states(states)[:GROUP_ROWS])
        else:  # by default, the unresolved, then what was resolved in the last day
            groups = list(chosen.in_states(["open", "acknowledged"])[:GROUP_ROWS])
            resolved = chosen.in_states(["resolved"]).filter(resolved_at__gte=now - timedelta(days=1))
            groups += resolved[: GROUP_ROWS - len(groups)]
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=SPARK_HOURS - 1)
    counts = {g.pk: [0] * SPARK_HOURS for g in groups}
    hourly = (
        Event.objects.filter(group_id__in=list(counts), time__gte=start)
        .annotate(hour=Trunc("time", "hour", tzinfo=UTC))
        .values("group_id", "hour")
        .annotate(n=Count("id"))
    )
    for row in hourly:
        index = int((row["hour"] - start).total_seconds() // 3600)
        if 0 <= index < SPARK_HOURS:
            counts[row["group_id"]][index] += row["n"]
    for g in groups:
        g.spark = grouping.sparkline(counts[g.pk])
        g.spark_total = sum(counts[g.pk])
        g.is_silenced = g.silenced(now)
    return {
        "groups": groups,
        "group_filterset": filterset,
        "group_query": query.urlencode(),
        "severity_choice": ",".join(query.getlist("severity")) or "any",
        "may_acknowledge": may_acknowledge(request.principal),
        "silence_choices": SILENCE_CHOICES.items(),
    }


@console_view(section="oncall")
def oncall(request: ConsoleRequest) -> HttpResponse:
    now = timezone.now()
    if request.GET.get("view") != "events" and "group" not in request.GET:
        context = {
            "view": "groups",
            "kinds": Event.Kind.choices,
            "tenant_filter": request.principal.is_operator,  # typed: a fleet has thousands of tenants
            **oncall_groups(request, now),
            **attention(request, now),
        }
        bad = bool(context["group_filterset"].errors)  # shown above the table, named
        return render(request, "console/oncall.html", context, status=400 if bad else 200)
    filterset, events = oncall_events(request)
    cursor = Event.objects.visible_to(request.principal).settled_cursor(now)  # no id the viewer may not see
    query = filled(request.GET)
    query.pop("after", None)
    context = {
        "view": "events",
        "filterset": filterset,
        "events": events.filter(id__lte=cursor).order_by("-id")[:TAIL_ROWS],
        "cursor": cursor,
        "query": query.urlencode(),
        "kinds": Event.Kind.choices,
        "severities": Event.Severity.choices,
        "tenant_filter": request.principal.is_operator,  # typed: a fleet has thousands of tenants
        "may_acknowledge": may_acknowledge(request.principal),
        **attention(request, now),
    }
    return render(request, "console/oncall.html", context, status=400 if filterset.errors else 200)


@console_view(section="oncall")
def oncall_tail(request: ConsoleRequest) -> HttpResponse:
    """New settled events after the cursor, newest first, with the next cursor (never misses nor repeats)."""
    now = timezone.now()
    try:
        after = params.integer("after", request.GET.get("after", "0"))
    except params.ParameterError as exc:
        # htmx swaps a 400 into the page (base.html's responseHandling): what it echoes is escaped.
        return HttpResponse(format_html("{}", str(exc)), status=400)
    filterset, events = oncall_events(request)
    if filterset.errors:
        return refused_parameters(filterset.errors)
    fresh = list(events.tail(after, now).order_by("-id")[:TAIL_ROWS])
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
    """The attention and restarts panels: every 10 s, and at once after an acknowledgement."""
    return render(request, "console/_oncall_panels.html", attention(request, timezone.now()))


def attention(request: ConsoleRequest, now: datetime) -> dict[str, Any]:
    """What on-call must see first: crash loops, endpoints that hang again and again, processes
    of the embedded stack that died (the last day), pods that restart (per replica slot), and
    critical events of the last day nobody has acknowledged.

    Each panel reads at most ATTENTION_EVENTS events, the newest of its kind in its window (an
    index scan on kind and time), and says so when there were more: a fleet ten times larger
    costs the panels nothing more, and a day with more hangs than that still names the
    endpoints hanging now."""
    visible = Event.objects.visible_to(request.principal)
    day = now - timedelta(days=1)
    hour = now - timedelta(hours=1)
    loops, loops_capped = per_replica_slot(visible.filter(kind="crash_loop", time__gte=hour), 10)
    hangs, hangs_capped = most_of_kind(
        visible.filter(kind="hang", time__gte=day), "endpoint_id", ("-n", "-last"), 10, least=2
    )
    restarts, restarts_capped = per_replica_slot(
        visible.filter(kind="restart", time__gte=day).exclude(pod=""), 20
    )
    # The stack's own deaths, restarts and crash loops alike: the page is not calm while they last.
    stack_deaths, stack_capped = per_replica_slot(
        visible.filter(reported_by=stack.REPORTER, kind__in=["restart", "crash_loop"], time__gte=day), 10
    )
    unacked = (
        visible.filter(severity="critical", acknowledged_at__isnull=True, time__gte=day)
        .order_by()[: ATTENTION_EVENTS + 1]
        .count()
    )
    return {
        "crash_loops": loops,
        "repeated_hangs": hangs,
        "restarts": restarts,
        "unacked_critical": min(unacked, ATTENTION_EVENTS),
        "unacked_critical_more": unacked > ATTENTION_EVENTS,
        "stack_deaths": stack_deaths,
        "attention_capped": loops_capped or hangs_capped or stack_capped,
        "restarts_capped": restarts_capped,
        "attention_events": ATTENTION_EVENTS,
        "locked_sign_ins": locked_sign_ins(now) if request.principal.is_operator else [],
    }


def most_of_kind(
    events: QuerySet[Event], subject: str, order: tuple[str, ...], rows: int, least: int = 1
) -> tuple[list[dict[str, Any]], bool]:
    """Per `subject` (with its endpoint's name) named at least `least` times among the newest
    ATTENTION_EVENTS of `events` (and any as old as the oldest of them): how many times (`n`)
    and the last (`last`), the first `rows` in `order`; and whether there were more events."""
    # The K-th newest event's time and whether there is a (K+1)-th: one index scan of K rows.
    edge = list(
        events.order_by("-time").values_list("time", flat=True)[ATTENTION_EVENTS - 1 : ATTENTION_EVENTS + 1]
    )
    newest = events.filter(time__gte=edge[0]) if edge else events
    tallies = (
        newest.values(subject, "endpoint_name")
        .annotate(n=Count("id"), last=Max("time"))
        .filter(n__gte=least)
        .order_by(*order)
    )
    return list(tallies[:rows]), len(edge) > 1


def per_replica_slot(events: QuerySet[Event], rows: int) -> tuple[list[dict[str, Any]], bool]:
    """The newest ATTENTION_EVENTS of `events` per endpoint and replica slot (grouping.replica_slot:
    the pod that replaces a dead one counts in its slot): how many (`n`), the last one's time,
    pod and message (`reason`), and the pods seen; the first `rows`, most first; and whether
    there were more events."""
    newest = list(
        events.order_by("-time", "-id").values("pod", "endpoint_id", "endpoint_name", "time", "message")[
            : ATTENTION_EVENTS + 1
        ]
    )
    slots: dict[tuple[int | None, str, str], dict[str, Any]] = {}
    for e in newest[:ATTENTION_EVENTS]:
        key = (e["endpoint_id"], e["endpoint_name"], grouping.replica_slot(e["pod"]))
        if key not in slots:  # newest first: the first seen is the slot's last
            slots[key] = {
                "slot": key[2],
                "endpoint_id": e["endpoint_id"],
                "endpoint_name": e["endpoint_name"],
                "n": 0,
                "last": e["time"],
                "pod": e["pod"],
                "reason": e["message"],
                "pods": set(),
            }
        slots[key]["n"] += 1
        slots[key]["pods"].add(e["pod"])
    ordered = sorted(slots.values(), key=lambda s: (-s["n"], -s["last"].timestamp()))
    return ordered[:rows], len(newest) > ATTENTION_EVENTS


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


@console_view(section="oncall")
def oncall_group_rows(request: ConsoleRequest) -> HttpResponse:
    """The groups table alone: every 5 s, and at once after an action on a group."""
    return render(request, "console/_oncall_groups.html", oncall_groups(request, timezone.now()))


def _operator_group(request: ConsoleRequest, pk: int) -> EventGroup:
    if not may_acknowledge(request.principal):
        raise PermissionDenied("only operators may act on on-call groups")
    group: EventGroup = get_object_or_404(EventGroup.objects.visible_to(request.principal), pk=pk)
    return group


def _group_row(
    request: ConsoleRequest, group: EventGroup, status: int = 200, error: str = ""
) -> HttpResponse:
    now = timezone.now()
    group = EventGroup.objects.select_related("tenant").get(pk=group.pk)
    context = oncall_groups(request, now) | {"group": group, "silence_error": error}
    for shown in context["groups"]:
        if shown.pk == group.pk:
            context["group"] = shown
            break
    else:  # no longer under the page's filters: draw it all the same, without its history
        group.spark, group.spark_total, group.is_silenced = "", 0, group.silenced(now)  # type: ignore[attr-defined]
    response = render(request, "console/_group_row.html", context, status=status)
    response["HX-Trigger"] = "group-changed"  # the attention panel and the groups table refresh
    return response


@require_POST
@console_view(section="oncall")
def group_acknowledge(request: ConsoleRequest, pk: int) -> HttpResponse:
    group = _operator_group(request, pk)
    group.acknowledge(request.user.username, timezone.now())
    return _group_row(request, group)


@require_POST
@console_view(section="oncall")
def group_resolve(request: ConsoleRequest, pk: int) -> HttpResponse:
    group = _operator_group(request, pk)
    group.resolve(request.user.username, timezone.now())
    return _group_row(request, group)


@require_POST
@console_view(section="oncall")
def group_silence(request: ConsoleRequest, pk: int) -> HttpResponse:
    """Silence for one of SILENCE_CHOICES minutes, with a reason (both required, else 400)."""
    group = _operator_group(request, pk)
    reason = request.POST.get("reason", "").strip()
    try:
        minutes = int(request.POST.get("minutes", ""))
    except ValueError:
        minutes = 0
    if minutes not in SILENCE_CHOICES:
        return _group_row(
            request, group, 400, f"minutes: choose one of {', '.join(map(str, SILENCE_CHOICES))}"
        )
    if not reason or len(reason) > 300:
        return _group_row(request, group, 400, "reason: say why (1 to 300 characters)")
    group.silence(request.user.username, timezone.now() + timedelta(minutes=minutes), reason)
    return _group_row(request, group)


@console_view(section="oncall")
def runbook(request: ConsoleRequest, kind: str) -> HttpResponse:
    """docs/runbooks/<kind>.md, for every kind of event: what it means, what to check, what to do."""
    if kind not in Event.Kind.values:
        raise Http404("no such kind of event")
    path = RUNBOOKS / f"{kind}.md"
    if not path.is_file():
        raise Http404("no runbook for this kind")
    return render(request, "console/runbook.html", {"kind": kind, "text": path.read_text()})
