"""Usage: what the routers metered of each endpoint, per UTC hour and per UTC day.

The collector (controlplane.endpoints.collector, through each source's `bill` in
controlplane.endpoints.samples) adds each router second, once, to its endpoint's UsageHour
(`record`), and in the same transaction to its UsageDay and its tenant's TenantUsageHour and
TenantUsageDay;
`usage` is the one query behind ``GET /api/v1/usage/`` and the console's endpoint page, a day
being the sum of its 24 hours, kept added up as they are written:

    an endpoint's slot 10:00:00-10:00:05 with 3 requests, 1.5 MU, 300 tokens in, 90 out and
    one 429, then the slot 10:59:55-11:00:00 with 1 request of 0.5 MU -> hour 10:00 reads
    4 requests, 2.0 MU, 1 throttled; the day reads the same plus its other hours.

A window is whole periods: its start is floored and its end rounded up to the granularity, so
``start=10:30`` by the hour includes the hour from 10:00 (`window`).

Usage is the tenant's bill and outlives the endpoint: a UsageHour keeps the endpoint's id, name
and tenant, and a delete leaves a DeletedEndpoint (`keep_billing_identity`, in the delete's
transaction) under which `record` bills whatever routers send of it after the delete (the
requests in flight then, seconds a router held through an outage), however late.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import F, QuerySet

from controlplane.endpoints.models import (
    DeletedEndpoint,
    Endpoint,
    TenantUsageDay,
    TenantUsageHour,
    UsageDay,
    UsageDayQuerySet,
    UsageHour,
    UsageHourQuerySet,
)
from controlplane.tenants.models import Principal
from dataplane.wire.load_samples import EndpointSecond

log = logging.getLogger("controlplane.usage")

HOUR = 3600
DAY = 86400
STEP_S = {"hour": HOUR, "day": DAY}
DEFAULT_PERIODS = {"hour": 24, "day": 7}  # without a start: the last 24 hours, the last 7 days
MAX_PERIODS = {"hour": 31 * 24, "day": 366}  # a window spans at most 31 days by the hour, 366 by the day
FIGURES = ("mu", "requests", "tokens_in", "tokens_out", "throttled", "errors")


class UsageError(ValueError):
    """A window that cannot be answered; `field` is the query parameter to blame."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Window:
    granularity: str  # "hour" or "day"
    start: int  # unix seconds, a multiple of the step
    end: int  # unix seconds, exclusive, a multiple of the step

    @property
    def step(self) -> int:
        return STEP_S[self.granularity]

    def periods(self) -> range:
        return range(self.start, self.end, self.step)


def window(granularity: str, start: float | None, end: float | None, now: float) -> Window:
    """Pure: the whole periods overlapping [start, end); the end defaults to now (the current
    period included), the start to DEFAULT_PERIODS before the end."""
    if granularity not in STEP_S:
        raise UsageError("granularity", f"{granularity!r} must be one of: {', '.join(STEP_S)}")
    step = STEP_S[granularity]
    last = math.ceil((now if end is None else end) / step) * step
    first = last - DEFAULT_PERIODS[granularity] * step if start is None else math.floor(start / step) * step
    if first >= last:
        raise UsageError("start", "must be before end")
    if (last - first) // step > MAX_PERIODS[granularity]:
        raise UsageError(
            "start",
            f"the window spans {(last - first) // step} {granularity}s; at most"
            f" {MAX_PERIODS[granularity]} by the {granularity}",
        )
    return Window(granularity, first, last)


@dataclass(frozen=True)
class Usage:
    """One endpoint's period: the sums of its UsageHours."""

    endpoint: int
    endpoint_name: str
    tenant: str
    start: int  # unix seconds
    end: int
    mu: float = 0.0
    requests: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    throttled: int = 0
    errors: int = 0

    @property
    def start_time(self) -> datetime:
        return datetime.fromtimestamp(self.start, UTC)

    @property
    def end_time(self) -> datetime:
        return datetime.fromtimestamp(self.end, UTC)


def usage(w: Window, principal: Principal | None = None, **filters: Any) -> QuerySet[Any, Any]:
    """The periods of the window that have usage, oldest first then by endpoint, of the hours
    or days the principal may see (`visible_to`; None: all) and `filters` select (an endpoint's,
    a tenant's): one query, a row per endpoint and period as stored, in the order of the
    (start, endpoint_id) index, so a page of it is read, not summed nor sorted (`as_usage`
    turns a row into a Usage). Deleted endpoints' are in it."""
    periods: UsageHourQuerySet | UsageDayQuerySet = (
        UsageHour.objects.all() if w.step == HOUR else UsageDay.objects.all()
    )
    rows = periods if principal is None else periods.visible_to(principal)
    found: QuerySet[Any, Any] = (
        rows.filter(**filters, start__gte=w.start, start__lt=w.end)
        .annotate(period=F("start"), **{f"sum_{f}": F(f) for f in FIGURES})
        .values("period", "endpoint_id", "endpoint_name", "tenant__name", *(f"sum_{f}" for f in FIGURES))
        .order_by("period", "endpoint_id")
    )
    return found


def as_usage(row: Mapping[str, Any], w: Window) -> Usage:
    return Usage(
        endpoint=row["endpoint_id"],
        endpoint_name=row["endpoint_name"],
        tenant=row["tenant__name"],
        start=row["period"],
        end=row["period"] + w.step,
        mu=row["sum_mu"],
        requests=row["sum_requests"],
        tokens_in=row["sum_tokens_in"],
        tokens_out=row["sum_tokens_out"],
        throttled=row["sum_throttled"],
        errors=row["sum_errors"],
    )


def series(endpoint: Endpoint, w: Window) -> list[Usage]:
    """Every period of the window for one endpoint, zeros where nothing was metered."""
    found = {u.start: u for u in (as_usage(r, w) for r in usage(w, endpoint_id=endpoint.pk))}
    blank: dict[str, Any] = {
        "endpoint": endpoint.pk,
        "endpoint_name": endpoint.name,
        "tenant": endpoint.tenant.name,
    }
    return [found.get(s) or Usage(**blank, start=s, end=s + w.step) for s in w.periods()]


def keep_billing_identity(endpoint: Endpoint) -> None:
    """In the endpoint's delete, its transaction: its DeletedEndpoint, under which `record` bills
    the seconds routers send after the delete (the requests in flight then, a router's held
    seconds). A reader sees either the endpoint or this, never neither."""
    DeletedEndpoint.objects.create(endpoint_id=endpoint.pk, name=endpoint.name, tenant_id=endpoint.tenant_id)


def identities(endpoint_ids: Iterable[int]) -> dict[int, tuple[str, int]]:
    """(name, tenant id) of each endpoint, live or deleted, by id; an id of neither is missing."""
    ids = set(endpoint_ids)
    fields = ("name", "tenant_id")
    deleted = DeletedEndpoint.objects.filter(endpoint_id__in=ids).values_list("endpoint_id", *fields)
    live = Endpoint.objects.filter(pk__in=ids).values_list("pk", *fields)
    return {pk: (name, tenant) for pk, name, tenant in (*deleted, *live)}


def renamed(endpoint: Endpoint) -> None:
    """An endpoint's usage carries its current name: a rename relabels its hours and days (in
    its transaction), so each endpoint id reads as one name in every period."""
    for periods in (UsageHour, UsageDay):
        periods.objects.filter(endpoint_id=endpoint.pk).exclude(endpoint_name=endpoint.name).update(
            endpoint_name=endpoint.name
        )


def hourly(slots: Iterable[tuple[int, int, EndpointSecond]]) -> Iterator[tuple[int, int, EndpointSecond]]:
    """Pure: (endpoint id, slot start second, its sum) -> (endpoint id, hour start, sum) per hour,
    leaving out what metered nothing."""
    hours: dict[tuple[int, int], EndpointSecond] = {}
    for endpoint_id, second, total in slots:
        if any((total.requests, total.mu, total.tokens_in, total.tokens_out, total.throttled, total.errors)):
            key = (endpoint_id, second // HOUR * HOUR)
            hours[key] = hours[key] + total if key in hours else total
    for (endpoint_id, hour), total in sorted(hours.items()):
        yield endpoint_id, hour, total


def record(slots: Iterable[tuple[int, int, EndpointSecond]]) -> int:
    """Add slots (or single seconds) to their endpoints' UsageHours, in one statement (an upsert
    that adds), and the same figures to their UsageDays and their tenants' TenantUsageHours and
    TenantUsageDays, a statement each, in one transaction: a day, a tenant's hour or day, is
    always its hours added. The
    caller records each once (the collector, in the transaction that marks it billed). Returns
    the hours touched."""
    hours = list(hourly(slots))
    # Each new hour under its endpoint's id, name and tenant, a deleted one's too (its
    # DeletedEndpoint); an id that never was an endpoint (a broken router's) bills no one.
    known = identities(h[0] for h in hours)
    for endpoint_id in {h[0] for h in hours} - known.keys():
        log.warning("usage of endpoint %s dropped: no such endpoint, live or deleted", endpoint_id)
    rows = [
        (endpoint_id, *known[endpoint_id], hour, t.mu, round(t.requests), round(t.tokens_in),
         round(t.tokens_out), round(t.throttled), round(t.errors))
        for endpoint_id, hour, t in hours
        if endpoint_id in known
    ]  # fmt: skip
    if not rows:
        return 0
    # The days, the tenants' hours and days from the same rounded rows, added in the rows' order
    days: dict[tuple[int, str, int, int], list[float]] = {}
    tenant_hours: dict[tuple[int, int], list[float]] = {}
    tenant_days: dict[tuple[int, int], list[float]] = {}
    for endpoint_id, name, tenant_id, hour, *figures in rows:
        for total in (
            days.setdefault((endpoint_id, name, tenant_id, hour // DAY * DAY), [0] * len(FIGURES)),
            tenant_hours.setdefault((tenant_id, hour), [0] * len(FIGURES)),
            tenant_days.setdefault((tenant_id, hour // DAY * DAY), [0] * len(FIGURES)),
        ):
            for i, value in enumerate(figures):
                total[i] += value
    identity = ("endpoint_id", "endpoint_name", "tenant_id", "start")
    with transaction.atomic():
        _add(UsageHour, identity, ("endpoint_id", "start"), rows)
        _add(
            UsageDay,
            identity,
            ("endpoint_id", "start"),
            [(*key, *total) for key, total in sorted(days.items())],
        )
        for model, tenants in ((TenantUsageHour, tenant_hours), (TenantUsageDay, tenant_days)):
            _add(
                model,
                ("tenant_id", "start"),
                ("tenant_id", "start"),
                [(tenant_id, start, *total) for (tenant_id, start), total in sorted(tenants.items())],
            )
    return len(rows)


def _add(
    model: type[UsageHour | UsageDay | TenantUsageHour | TenantUsageDay],
    keys: tuple[str, ...],
    unique: tuple[str, ...],
    rows: list[tuple[Any, ...]],
) -> None:
    """One upsert: new rows inserted, existing ones' FIGURES added to."""
    table = connection.ops.quote_name(model._meta.db_table)
    columns = (*keys, *FIGURES)
    added = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in FIGURES)
    values = ", ".join(["(" + ", ".join(["%s"] * len(columns)) + ")"] * len(rows))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES {values}"
            f" ON CONFLICT ({', '.join(unique)}) DO UPDATE SET {added}",
            [v for row in rows for v in row],
        )
