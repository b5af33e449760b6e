"""What the capacity page reads of the past, in a few queries whose rows grow with the window,
never with the fleet's endpoints: each GPU type's history chart (each pool's snapshots averaged
over a bucket, a minute up to six hours from the snapshots themselves, an hour beyond from the
pools' CapacityHours, controlplane.capacity.snapshots, so a week is 168 rows per pool instead of
10,080, only the hour the window's start cuts averaged from its snapshots; then the pools of a
type added), its hourly peaks for the forecast (and, while they are too few, when it will show),
and each tenant's usage from its hours and days.
"""

import math
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Avg, F, FloatField, Q, QuerySet, Sum
from django.db.models.functions import TruncHour, TruncMinute

from capacity.autoscaler import forecast
from controlplane.capacity.models import CapacityHour, CapacitySnapshot, Reservation
from controlplane.endpoints.models import TenantUsageDay, TenantUsageHour
from controlplane.tenants.models import Tenant

HOUR = 3600
DAY = 86400
MINUTE_CHARTS_S = 6 * HOUR  # windows up to this long are charted per minute, longer ones per hour
FIGURES = ("have", "sold", "used")  # MU/min, each a series of the chart

Point = dict[str, float]  # figure -> MU/min, the pools of a GPU type added


def capacity_history(since: datetime, window_s: float) -> dict[str, list[tuple[float, Point]]]:
    """Per GPU type, the chart's buckets from `since` on: (bucket's start in unix seconds, each
    figure averaged per pool over the bucket, then added over the type's pools), ascending."""
    points: dict[str, dict[float, Point]] = defaultdict(
        lambda: defaultdict(lambda: dict.fromkeys(FIGURES, 0.0))
    )
    if window_s <= MINUTE_CHARTS_S:
        _add_snapshots(points, CapacitySnapshot.objects.filter(at__gte=since), TruncMinute)
    else:
        first_hour = math.ceil(since.timestamp() / HOUR) * HOUR
        head = CapacitySnapshot.objects.filter(at__gte=since, at__lt=datetime.fromtimestamp(first_hour, UTC))
        _add_snapshots(points, head, TruncHour)
        hours = (
            CapacityHour.objects.filter(start__gte=first_hour)
            .values("pool__gpu_type__name", "start")
            .annotate(have=_hour_average("have"), sold=_hour_average("sold"), used=_hour_average("used"))
            .order_by()
        )
        for row in hours:  # each pool's hour averaged, the type's pools added, in the database
            point = points[row["pool__gpu_type__name"]][float(row["start"])]
            for figure in ("have", "sold", "used"):  # literal keys: a row is a TypedDict to mypy
                point[figure] += row[figure]
    return {name: sorted(buckets.items()) for name, buckets in points.items()}


def snapshot_interval_s() -> float:
    """How often each pool's ledger is snapshotted (CAPACITY_SNAPSHOT_INTERVAL_S)."""
    schedule = settings.CELERY_BEAT_SCHEDULE["record-capacity-snapshot"]["schedule"]
    if not isinstance(schedule, int | float):
        raise TypeError(f"the capacity snapshot's schedule is an interval in seconds, not {schedule!r}")
    return float(schedule)


def history_gap_s(window_s: float) -> float:
    """How far apart two of the chart's buckets may start and still be joined: a bucket and a
    snapshot interval, so a snapshot late by a second (its minute empty, the next holding two)
    is no break, and a minute (an hour) without snapshots is."""
    bucket_s = 60 if window_s <= MINUTE_CHARTS_S else HOUR
    return bucket_s + snapshot_interval_s()


def forecast_wait(name: str, peaks: list[tuple[float, float]], now: float) -> str:
    """Why a GPU type has no forecast yet, and when it will have one: the forecast of an hour
    needs that hour's peak on two previous days, so the chart's last hour (a day ahead) is first
    forecast a day less an hour after the first hour recorded."""
    if not peaks:
        return (
            f"No forecast for {name} yet: it needs each hour's peak on two previous days, and no "
            "hour of its pools is recorded yet. It starts a day after the first."
        )
    first = datetime.fromtimestamp(peaks[0][0], UTC)
    when = first + timedelta(days=1) - timedelta(hours=1)
    if when.timestamp() > now:
        return (
            f"No forecast for {name} yet: it needs each hour's peak on two previous days, and its "
            f"pools are recorded from {first:%a %d %b %H:%M} UTC. It starts {when:%a %d %b %H:%M} UTC."
        )
    return (
        f"No forecast for {name}: the hours recorded since {first:%a %d %b %H:%M} UTC hold no hour's "
        "peak on two previous days."
    )


def _hour_average(figure: str) -> Sum:
    """The pools' averages over their hours, added: sum over pools of (figure's sum / snapshots)."""
    return Sum(F(f"{figure}_mu_sum") / F("snapshots"), output_field=FloatField())


def _add_snapshots(
    points: dict[str, dict[float, Point]],
    snapshots: QuerySet[CapacitySnapshot],
    bucket: type[TruncMinute | TruncHour],
) -> None:
    """Average the snapshots per pool and bucket, then add the pools of a GPU type, both in the
    database: 6 hours of 20 pools are 7,200 averages, 720 rows once added (two GPU types)."""
    per_pool = (
        snapshots.annotate(bucket=bucket("at"), gpu_type=F("pool__gpu_type__name"))
        .values("gpu_type", "pool_id", "bucket")
        .annotate(
            have=Avg("have_mu_per_minute"), sold=Avg("sold_mu_per_minute"), used=Avg("used_mu_per_minute")
        )
        .order_by()
    )
    sql, params = per_pool.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT gpu_type, bucket, SUM(have), SUM(sold), SUM(used)"
            f" FROM ({sql}) per_pool GROUP BY gpu_type, bucket",
            params,
        )
        for name, start, have, sold, used in cursor.fetchall():
            point = points[name][_unix(start)]
            point["have"] += have
            point["sold"] += sold
            point["used"] += used


def _unix(bucket: datetime | str) -> float:
    """A bucket's start read outside the ORM: a datetime in UTC without its zone (PostgreSQL's
    date_trunc of the time at UTC), or its ISO text (SQLite)."""
    if isinstance(bucket, str):
        bucket = datetime.fromisoformat(bucket)
    return (bucket if bucket.tzinfo else bucket.replace(tzinfo=UTC)).timestamp()


def hourly_peaks(now: datetime) -> dict[str, list[tuple[float, float]]]:
    """Per GPU type, each whole hour's peak of used MU/min over the forecast's look-back (four
    weeks and a day), the pools of a type added: (hour's start, MU/min), ascending. From the
    pools' hours: 20 pools' four weeks and a day are 13,920 rows, summed to 696 per type by the
    database. (The hour the look-back starts in is left out: the forecast reads nothing that
    old, only the hours of the last four weeks.)"""
    first_hour = math.ceil((now - timedelta(seconds=forecast.HISTORY_S)).timestamp() / HOUR) * HOUR
    rows = (
        CapacityHour.objects.filter(start__gte=first_hour)
        .values_list("pool__gpu_type__name", "start")
        .annotate(peak=Sum("used_mu_peak"))
        .order_by("pool__gpu_type__name", "start")
    )
    peaks: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for name, start, peak in rows:
        peaks[name].append((float(start), peak))
    return dict(peaks)


def tenant_usage(now: datetime, most: int = 20) -> list[dict[str, Any]]:
    """Per tenant, for the `most` that used the most in the last 24 hours (the table a page
    shows, not the fleet's every tenant): MU metered in the last 24 hours and per day over the
    last 7, against what its reservations let it use in a day (MU/min x 1,440). From the
    tenants' hours and days, each its endpoints' hours (those /api/v1/usage/ sums) added,
    however many endpoints: the week is its whole UTC days and the hours before the first
    midnight and after the last, the day its 24 hours, so 500 tenants read about 21,000 rows,
    not 84,000 hours (or 1.7 million endpoints' hours); summed by the database per tenant id,
    the names joined after."""
    hour = int(now.timestamp()) // HOUR * HOUR
    day_ago, week_ago = hour + HOUR - DAY, hour + HOUR - 7 * DAY
    first_midnight, last_midnight = -(-week_ago // DAY) * DAY, (hour + HOUR) // DAY * DAY
    # week: hours [week_ago, first midnight), days [first midnight, last midnight), hours after
    ends = Q(start__lt=first_midnight) | Q(start__gte=last_midnight)
    hours = (
        TenantUsageHour.objects.filter(
            Q(start__gte=week_ago, start__lt=first_midnight) | Q(start__gte=day_ago)
        )
        .values("tenant_id")
        .annotate(
            day=Sum("mu", filter=Q(start__gte=day_ago)),
            ends=Sum("mu", filter=ends),
            throttled=Sum("throttled", filter=Q(start__gte=day_ago)),
        )
        .order_by()
    )
    days = dict(
        TenantUsageDay.objects.filter(start__gte=first_midnight, start__lt=last_midnight)
        .values_list("tenant_id")
        .annotate(mu=Sum("mu"))
        .order_by()
    )
    names = dict(Tenant.objects.values_list("pk", "name"))
    used: dict[str, dict[str, Any]] = {
        names[t]: {"day": None, "week": 0.0, "throttled": None}
        for t in days  # deleted endpoints' included
    }
    for sums in hours:
        used[names[sums["tenant_id"]]] = {
            "day": sums["day"],
            "week": sums["ends"] or 0.0,
            "throttled": sums["throttled"],
        }
    for tenant_id, mu in days.items():
        used[names[tenant_id]]["week"] += mu
    # The `most` tenants that used the most in the last day; while fewer than that used any,
    # the tenants of the largest reservations beside them, read largest first by the index on
    # their size (summing every reservation of the fleet per tenant took 65 ms at 100,000).
    shown = sorted(used, key=lambda n: (-float(used[n]["day"] or 0.0), n))[:most]
    if len(shown) < most:
        largest = Reservation.objects.order_by("-mu_per_minute", "id").values_list(
            "endpoint__tenant__name", flat=True
        )
        for name in largest[: 10 * most]:
            if name not in shown:
                shown.append(name)
                if len(shown) == most:
                    break
    reserved = dict(
        Reservation.objects.filter(endpoint__tenant__name__in=shown)
        .values_list("endpoint__tenant__name")
        .annotate(mu=Sum("mu_per_minute"))
        .order_by()
    )
    out: list[dict[str, Any]] = []
    for name in shown:
        row: dict[str, Any] = dict(used.get(name) or {})
        per_day = (reserved.get(name) or 0) * 1440
        day = float(row.get("day") or 0.0)
        out.append(
            {
                "tenant": name,
                "reserved_mu_per_minute": reserved.get(name) or 0,
                "reserved_mu_per_day": per_day,
                "used_mu_day": day,
                "used_mu_week_per_day": float(row.get("week") or 0.0) / 7,
                "share": day / per_day if per_day else None,
                "throttled": row.get("throttled") or 0,
            }
        )
    out.sort(key=lambda r: (-r["used_mu_day"], r["tenant"]))
    return out
