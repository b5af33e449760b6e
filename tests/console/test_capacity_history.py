"""The capacity page's history from the hourly rollup: the same figures as averaging the raw
snapshots (the page's reads before the rollup, kept here as the reference), in a constant
number of queries whatever the number of pools and hours."""

import math
import random
import re
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
from django.db import connection
from django.db.models import Avg, Max, Q, Sum
from django.db.models.functions import TruncHour, TruncMinute
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from capacity.autoscaler import forecast
from controlplane.capacity import snapshots
from controlplane.capacity.models import CapacityHour, CapacitySnapshot, GpuPool
from controlplane.console import charts
from controlplane.console.history import capacity_history, forecast_wait, hourly_peaks, tenant_usage
from controlplane.console.views.capacity import capacity_context
from controlplane.endpoints import usage
from controlplane.endpoints.models import UsageHour
from controlplane.selling import delete_endpoint, sell
from controlplane.tenants.models import Tenant
from dataplane.wire.load_samples import EndpointSecond

# Not on an hour, a minute or a second: every window starts inside an hour.
NOW = datetime(2026, 11, 20, 14, 37, 23, 250000, tzinfo=UTC)


def snapshot(pool, at, rng) -> CapacitySnapshot:
    have = rng.choice([800.0, 1600.0])
    return CapacitySnapshot(
        pool=pool, at=at, have_gpus=8, sold_gpus=3, used_gpus=2, have_mu_per_minute=have,
        sold_mu_per_minute=rng.uniform(0, have), used_mu_per_minute=rng.uniform(0, have) / 3,
    )  # fmt: skip


@pytest.fixture
def pools(h100, l40s):
    return [
        GpuPool.objects.create(name=name, gpu_type=gpu, region="r", gpu_count=8)
        for name, gpu in (("h100-a", h100), ("h100-b", h100), ("l40s-a", l40s))
    ]


@pytest.fixture
def recorded(pools):
    """A month of snapshots as beat writes them, all pools' at once: every 73 minutes over 30
    days, minutes either side of each window's start, and every minute of the last 8 hours
    (those 7 minutes to a write, a catch-up); a pool has two in some minutes (a second beat),
    none in others (left out of a write)."""
    rng = random.Random(5)
    times = {NOW - timedelta(minutes=m) for m in range(0, 30 * 1440, 73)}
    starts = [*charts.WINDOWS.values(), forecast.HISTORY_S]
    times |= {NOW - timedelta(seconds=s + edge) for s in starts for edge in (-60, 60)}
    recent = sorted(NOW - timedelta(minutes=m, seconds=rng.randrange(60)) for m in range(8 * 60))
    writes = [[at] for at in sorted(times)] + [recent[i : i + 7] for i in range(0, len(recent), 7)]
    for batch in writes:
        rows = [snapshot(p, at, rng) for at in batch for p in pools if rng.random() > 0.05]
        if rng.random() < 0.05:
            rows.append(snapshot(pools[0], batch[0] + timedelta(seconds=5), rng))
        snapshots.write(rows)
    return pools


def old_history(window: str) -> dict[str, list[tuple[float, dict[str, float]]]]:
    """The page's chart as it read before the rollup: every snapshot of the window, averaged per
    pool and bucket, the pools of a GPU type added."""
    since = NOW - timedelta(seconds=charts.WINDOWS[window])
    bucket = TruncMinute if charts.WINDOWS[window] <= 6 * 3600 else TruncHour
    history: dict[str, dict[float, dict[str, float]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(float))
    )
    rows = (
        CapacitySnapshot.objects.filter(at__gte=since)
        .annotate(bucket=bucket("at"))
        .values("pool__gpu_type__name", "pool_id", "bucket")
        .annotate(
            have=Avg("have_mu_per_minute"), sold=Avg("sold_mu_per_minute"), used=Avg("used_mu_per_minute")
        )
        .order_by()
    )
    for row in rows:
        point = history[row["pool__gpu_type__name"]][row["bucket"].timestamp()]
        for figure in ("have", "sold", "used"):
            point[figure] += row[figure]
    return {name: sorted((t, dict(p)) for t, p in buckets.items()) for name, buckets in history.items()}


def old_peaks() -> dict[str, list[tuple[float, float]]]:
    """The forecast's hourly peaks as read before the rollup, from every snapshot."""
    rows = (
        CapacitySnapshot.objects.filter(at__gte=NOW - timedelta(seconds=forecast.HISTORY_S))
        .annotate(hour=TruncHour("at"))
        .values("pool__gpu_type__name", "pool_id", "hour")
        .annotate(peak=Max("used_mu_per_minute"))
        .order_by()
    )
    summed: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for row in rows:
        summed[row["pool__gpu_type__name"]][row["hour"].timestamp()] += row["peak"]
    return {name: sorted(hours.items()) for name, hours in summed.items()}


def assert_same_points(new, old):
    assert new.keys() == old.keys()
    for name in old:
        assert [t for t, _ in new[name]] == [t for t, _ in old[name]], name
        for (t, got), (_, want) in zip(new[name], old[name], strict=True):
            # the same averages added in another order: equal to the last bits of a double
            assert got == pytest.approx(want, rel=1e-12, abs=1e-9), (name, t)


@pytest.mark.parametrize("window", list(charts.WINDOWS))
def test_the_chart_shows_what_the_snapshots_average_to(recorded, window):
    new = capacity_history(NOW - timedelta(seconds=charts.WINDOWS[window]), charts.WINDOWS[window])
    old = old_history(window)
    assert_same_points(new, old)
    assert len(old["h100-80gb"]) > 10


def test_the_week_reads_hours_and_only_its_first_hours_snapshots(recorded):
    since = NOW - timedelta(days=7)
    with CaptureQueriesContext(connection) as queries:
        capacity_history(since, 7 * 86400)
    sql = [q["sql"] for q in queries]
    assert len(sql) == 2
    # the snapshots of the first hour only: from the window's start to the next whole hour
    first_hour = datetime.fromtimestamp(math.ceil(since.timestamp() / 3600) * 3600, UTC)
    assert CapacitySnapshot.objects.filter(at__gte=since, at__lt=first_hour).count() < 10
    assert any("capacity_capacityhour" in s for s in sql)


def test_the_forecast_reads_the_hours_peaks_and_forecasts_the_same(recorded):
    old, new = old_peaks(), hourly_peaks(NOW)
    # Each hour's peak as before; the hour the look-back starts in (cut by it) is left out.
    first_hour = math.ceil((NOW.timestamp() - forecast.HISTORY_S) / 3600) * 3600
    assert_same_points(
        {k: [(t, {"peak": v}) for t, v in hours] for k, hours in new.items()},
        {k: [(t, {"peak": v}) for t, v in hours if t >= first_hour] for k, hours in old.items()},
    )
    assert all(hours[0][0] < first_hour for hours in old.values())  # there was a cut hour to leave out
    start = NOW.timestamp() // 3600 * 3600
    for name in old:
        for k in range(25):
            t = start + k * 3600
            before = forecast.predicted_peak(old[name], t, lead_s=0.0, horizon_s=3600)
            after = forecast.predicted_peak(new[name], t, lead_s=0.0, horizon_s=3600)
            assert after == pytest.approx(before, rel=1e-12), (name, k)
            assert before is not None


def test_the_rollup_holds_what_its_snapshots_add_up_to(recorded):
    hours = {(h.pool_id, h.start): h for h in CapacityHour.objects.all()}
    rows = list(
        CapacitySnapshot.objects.values_list("pool_id", "at", "have_mu_per_minute", "used_mu_per_minute")
    )
    expected: dict[tuple[int, int], list[float]] = defaultdict(list)
    for pool_id, at, _, used in rows:
        expected[(pool_id, int(at.timestamp()) // 3600 * 3600)].append(used)
    assert hours.keys() == expected.keys()
    for key, used in expected.items():
        assert hours[key].snapshots == len(used)
        assert hours[key].used_mu_sum == pytest.approx(sum(used), rel=1e-12)
        assert hours[key].used_mu_peak == max(used)
    assert sum(h.have_mu_sum for h in hours.values()) == pytest.approx(sum(r[2] for r in rows), rel=1e-12)


def test_a_snapshot_whose_hour_cannot_be_written_is_not_stored(pools, monkeypatch):
    rng = random.Random(1)
    snapshots.write([snapshot(p, NOW, rng) for p in pools])

    def crash(hours):
        raise RuntimeError("the database went away between the two statements")

    monkeypatch.setattr(snapshots, "_add_to_hours", crash)
    with pytest.raises(RuntimeError):
        snapshots.write([snapshot(p, NOW + timedelta(minutes=1), rng) for p in pools])
    assert CapacitySnapshot.objects.count() == 3
    assert sum(CapacityHour.objects.values_list("snapshots", flat=True)) == 3


def test_snapshots_and_hours_are_kept_as_long_as_their_retention(pools, settings):
    settings.CAPACITY_SNAPSHOT_RETENTION_DAYS, settings.CAPACITY_HOUR_RETENTION_DAYS = 8, 30
    rng = random.Random(2)
    for age in (timedelta(days=31), timedelta(days=9), timedelta(days=7), timedelta(0)):
        snapshots.write([snapshot(pools[0], NOW - age, rng)])
    snapshots.prune(NOW)
    assert sorted(NOW - at for at in CapacitySnapshot.objects.values_list("at", flat=True)) == [
        timedelta(0),
        timedelta(days=7),
    ]
    assert CapacityHour.objects.count() == 3  # 9 days old: its hour stays for the forecast


@pytest.mark.parametrize("window", list(charts.WINDOWS))
def test_the_charts_queries_do_not_grow_with_pools_or_hours(h100, l40s, window):
    rng = random.Random(3)

    def grow(n: int) -> int:
        pools = [
            GpuPool.objects.create(name=f"p{n}-{i}", gpu_type=(h100, l40s)[i % 2], region="r", gpu_count=8)
            for i in range(n)
        ]
        for m in range(0, n * 8 * 60, 29):  # n x 8 hours of snapshots
            snapshots.write([snapshot(p, NOW - timedelta(minutes=m), rng) for p in pools])
        with CaptureQueriesContext(connection) as queries:
            capacity_history(NOW - timedelta(seconds=charts.WINDOWS[window]), charts.WINDOWS[window])
            hourly_peaks(NOW)
            tenant_usage(NOW)
        return len(queries)

    assert grow(2) == grow(10)


def test_the_tenant_table_fills_up_with_the_tenants_of_the_largest_reservations(owner, other, make_endpoint):
    """Fewer tenants used anything than the table shows: the tenants of the largest
    reservations follow them, each with all its reservations summed."""
    third = Tenant.objects.create(name="third", gpu_quota=other.gpu_quota)
    used, small, large = (
        make_endpoint(owner, "used"),
        make_endpoint(other, "small"),
        make_endpoint(third, "large"),
    )
    for endpoint, mu in [(small, 30), (large, 60)]:
        sell(endpoint, mu_per_minute=mu, best_effort_allowed=True, sold_by="t")
    sell(make_endpoint(other, "small-too"), mu_per_minute=40, best_effort_allowed=True, sold_by="t")
    hour = int(NOW.timestamp()) // 3600 * 3600
    usage.record([(used.pk, hour, EndpointSecond(mu=5.0, throttled=0, requests=1))])
    assert [r["tenant"] for r in tenant_usage(NOW, most=2)] == ["owner", "third"]
    rows = tenant_usage(NOW)
    assert [(r["tenant"], r["reserved_mu_per_minute"]) for r in rows] == [
        ("owner", 0), ("other", 70), ("third", 60)
    ]  # fmt: skip


def test_the_tenant_table_shows_what_the_endpoints_hours_add_up_to(owner, other, make_endpoint):
    rng = random.Random(6)
    endpoints = [make_endpoint(owner, f"o{i}") for i in range(3)] + [make_endpoint(other, "x")]
    sell(endpoints[0], mu_per_minute=50, best_effort_allowed=True, sold_by="t")
    hour = int(NOW.timestamp()) // 3600 * 3600
    # 9 days of hours: some before the week, in its first and last (UTC) days, in the day
    ages = [rng.randrange(9 * 24) for _ in range(30)] + [0, 1, 5, 30, 7 * 24 - 1, 7 * 24 - 2, 7 * 24]
    for age in ages:
        usage.record(
            (e.pk, hour - age * 3600 + rng.randrange(3600),
             EndpointSecond(mu=rng.uniform(0, 50), throttled=rng.randint(0, 3), requests=1))
            for e in rng.sample(endpoints, 2)
        )  # fmt: skip
    delete_endpoint(endpoints[2])  # its usage stays its tenant's
    # The table as it read before the tenants' hours: every endpoint's hours of the week.
    day_ago, week_ago = hour + 3600 - 86400, hour + 3600 - 7 * 86400
    old = {
        row["tenant__name"]: row
        for row in UsageHour.objects.filter(start__gte=week_ago)
        .values("tenant__name")
        .annotate(
            day=Sum("mu", filter=Q(start__gte=day_ago)),
            week=Sum("mu"),
            throttled=Sum("throttled", filter=Q(start__gte=day_ago)),
        )
        .order_by()
    }
    rows = tenant_usage(NOW)
    assert [r["tenant"] for r in rows] == sorted(old, key=lambda t: (-old[t]["day"], t))
    for r in rows:
        want = old[r["tenant"]]
        assert r["used_mu_day"] == pytest.approx(want["day"], rel=1e-12)
        assert r["used_mu_week_per_day"] == pytest.approx(want["week"] / 7, rel=1e-12)
        assert r["throttled"] == want["throttled"]
    assert rows[[r["tenant"] for r in rows].index("owner")]["reserved_mu_per_day"] == 50 * 1440
    # A page shows the tenants that used the most, however many the fleet has.
    assert tenant_usage(NOW, most=1) == rows[:1]


def chart_ticks(svg: str) -> list[str]:
    return re.findall(r'<text class="tick x"[^>]*>([^<]*)</text>', svg)


def test_every_gpu_types_chart_spans_one_axis_and_breaks_where_no_snapshot_was(pools):
    """H100's pools snapshotted every minute of the last hour but five, L40S's only in the last
    twenty minutes: both charts span the hour, H100's lines break for the five minutes (no line
    drawn across them), and hovering a minute shows its exact MU/min."""
    now = timezone.now()
    h100_a, h100_b, l40s_a = pools
    for m in range(58):  # their minutes all inside the window, whatever second it is
        at = now - timedelta(minutes=m, seconds=1)
        rows = [] if 30 <= m < 35 else [snapshot(p, at, random.Random(m)) for p in (h100_a, h100_b)]
        if m < 20:
            rows.append(snapshot(l40s_a, at, random.Random(m)))
        snapshots.write(rows)
    CapacitySnapshot.objects.filter(pool__in=pools).update(have_mu_per_minute=800.125)
    groups = {g["gpu_type"].name: g for g in capacity_context("1h")["groups"]}
    h100, l40s = groups["h100-80gb"]["chart"], groups["l40s-48gb"]["chart"]
    assert chart_ticks(h100) == chart_ticks(l40s) and len(chart_ticks(h100)) >= 5
    assert h100.count('<polyline class="have"') == 2 and l40s.count('<polyline class="have"') == 1
    hovers = [unescape(t) for t in re.findall(r'<rect class="hover"[^>]*><title>([^<]*)</title>', h100)]
    assert len(hovers) == 53 and all("\nhave: 1,600.25 MU/min\n" in h for h in hovers)  # two pools


def test_no_history_is_a_sentence_saying_when_the_forecast_will_show(pools):
    now = datetime(2026, 11, 20, 14, 37, tzinfo=UTC).timestamp()
    assert forecast_wait("H100", [], now) == (
        "No forecast for H100 yet: it needs each hour's peak on two previous days, and no hour of "
        "its pools is recorded yet. It starts a day after the first."
    )
    three_hours = [(now // 3600 * 3600 - 3600 * k, 50.0) for k in (3, 2, 1)]
    assert forecast_wait("H100", three_hours, now).endswith(
        "its pools are recorded from Fri 20 Nov 11:00 UTC. It starts Sat 21 Nov 10:00 UTC."
    )
    # The page: the history chart (an hour of snapshots), a sentence in place of the forecast.
    for m in range(60):
        snapshots.write([snapshot(p, timezone.now() - timedelta(minutes=m), random.Random(m)) for p in pools])
    groups = capacity_context("1h")["groups"]
    assert all(g["chart"].startswith('<svg class="chart"') for g in groups)
    assert all(g["forecast_chart"].startswith('<p class="chart-empty">No forecast for ') for g in groups)
    assert all(" It starts " in g["forecast_chart"] for g in groups)
