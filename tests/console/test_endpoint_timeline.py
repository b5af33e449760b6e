"""The endpoint page's timeline over six hours, a day, a week: its load buckets summed per
minute once the collector has finished the minute, read with the buckets around them, give the
charts the buckets alone give, in a constant number of queries."""

import random
import re
from datetime import UTC, datetime
from html import unescape

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.console import charts
from controlplane.console.views.endpoints import bin_width, timeline_bins
from controlplane.endpoints import collector, timeline
from controlplane.endpoints.models import Lease, LoadBucket, TimelineMinute

NOW = datetime(2026, 11, 29, 12, 0, 17, 500000, tzinfo=UTC)  # inside a minute and a 5-second slot
TS = int(NOW.timestamp())


def at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def collected_through(ts: int) -> None:
    """The collector's cursor: it has written every bucket up to `ts`."""
    Lease.objects.update_or_create(name=collector.COLLECTOR, defaults={"cursor": ts})


@pytest.fixture
def loaded(owner, make_endpoint):
    """A day and an hour of the endpoint's buckets, 5 s each where there was load, with gaps,
    histograms of several lengths and none, replicas changing; another endpoint's alongside."""
    rng = random.Random(9)
    chat, other = make_endpoint(owner, "chat"), make_endpoint(owner, "batch")
    last = TS // 5 * 5 - 5
    rows = []
    for end in range(last - 25 * 3600, last + 1, 5):
        if rng.random() < 0.8 and end < last - 120:  # every slot of the last two minutes
            continue
        for e in (chat, other) if rng.random() < 0.3 else (chat,):
            counts = rng.choice(
                [[], [rng.randrange(9) for _ in range(15)], [rng.randrange(9) for _ in range(4)]]
            )
            rows.append(
                LoadBucket(
                    endpoint=e, end=end, seconds=rng.choice([5, 5, 5, 3]), in_flight=rng.uniform(0, 9),
                    queued=rng.choice([0.0, rng.uniform(0, 3)]), mu_per_minute=60.0,
                    requests=rng.randrange(40), queue_depth=0, latency_counts=counts, errors=0, throttled=0,
                    ready_replicas=rng.randrange(4), desired_replicas=rng.randrange(4),
                )
            )  # fmt: skip
    LoadBucket.objects.bulk_create(rows, batch_size=5000)
    collected_through(last)
    return chat


def roll_up_until(ts: int, monkeypatch, per_pass: int = 100_000) -> None:
    monkeypatch.setattr(timeline, "MINUTES_PER_PASS", per_pass)
    assert timeline.roll_up(at(ts)) is not None


def bins_of(rows, width):
    return [
        (b.slot, b.end, b.desired, b.ready, b.seconds, b.requests, b.latency_counts, round(b.in_flight, 9))
        for b in timeline_bins(rows, width)
    ]


def from_buckets(endpoint, since):
    return list(
        LoadBucket.objects.filter(endpoint=endpoint, end__gt=since)
        .order_by("end")
        .values_list(*timeline.BUCKET_FIELDS)
    )


@pytest.mark.parametrize("window", ["6h", "1d", "1w"])
@pytest.mark.parametrize("rolled_back_s", [0, 3600, 86400 + 3600])  # all, but the last hour, none
def test_the_charts_from_minutes_are_the_charts_from_buckets(loaded, monkeypatch, window, rolled_back_s):
    roll_up_until(TS - rolled_back_s, monkeypatch)  # through what the collector had finished then
    Lease.objects.filter(name=timeline.TIMELINE).update(
        cursor=min(timeline.rolled_up_through(), (TS - rolled_back_s) // 60 * 60)
    )
    since, width = TS + 0.5 - charts.WINDOWS[window], bin_width(charts.WINDOWS[window])
    assert width % 60 == 0
    rows = timeline.chart_rows(loaded, since, TS + 0.5)
    assert bins_of(rows, width) == bins_of(from_buckets(loaded, since), width)
    # the last minute's figures (the page's requests/s and latency) from buckets alone
    recent = [r for r in rows if r[0] > TS + 0.5 - 60]
    assert recent == [r for r in from_buckets(loaded, since) if r[0] > TS + 0.5 - 60] and recent
    if rolled_back_s == 0:
        # a row a minute (2.4 buckets here, 12 at full load), buckets only at the edges
        assert len(rows) < len(from_buckets(loaded, since)) / 2


def test_a_minute_is_rolled_up_once_when_the_collector_has_finished_it(owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    minute = TS // 60 * 60
    LoadBucket.objects.bulk_create(
        LoadBucket(
            endpoint=chat, end=end, seconds=5, in_flight=2.0, queued=1.0, mu_per_minute=60.0, requests=10,
            queue_depth=0, latency_counts=[1, 2], errors=0, throttled=0, ready_replicas=1,
            desired_replicas=end % 7,
        )
        for end in range(minute - 55, minute + 6, 5)
    )  # fmt: skip
    Lease.objects.create(name=timeline.TIMELINE, cursor=minute - 60)  # rolled up before
    collected_through(minute - 5)  # the minute's last slot is not written yet
    assert timeline.roll_up(at(TS)) == 0 and not TimelineMinute.objects.exists()
    collected_through(minute + 5)
    assert timeline.roll_up(at(TS + 30)) == 1
    assert timeline.roll_up(at(TS + 60)) == 0  # once
    m = TimelineMinute.objects.get()
    assert (m.end, m.last_end, m.desired_replicas, m.seconds, m.requests) == (
        minute,
        minute,
        minute % 7,
        60,
        120,
    )
    assert (m.in_flight_s, m.latency_counts) == (3.0 * 60, [12, 24])


def test_rolling_up_starts_at_the_oldest_bucket_kept_and_catches_up_a_few_minutes_a_pass(
    owner, make_endpoint, settings
):
    settings.LOAD_BUCKET_RETENTION_S = 3600
    make_endpoint(owner, "chat")
    minute = TS // 60 * 60
    collected_through(minute)
    TimelineMinute.objects.create(
        endpoint=owner.endpoints.get(), end=minute - 7200, last_end=minute - 7200, desired_replicas=1,
        ready_replicas=1, seconds=5, in_flight_s=1.0, requests=1,
    )  # fmt: skip
    assert timeline.roll_up(at(TS)) == timeline.MINUTES_PER_PASS
    first = (TS - 3600 + 59) // 60 * 60  # the oldest minute whose every bucket is kept
    assert timeline.rolled_up_through() == first + timeline.MINUTES_PER_PASS * 60
    assert not TimelineMinute.objects.exists()  # past the buckets' retention
    for k in range(1, 30):
        timeline.roll_up(at(TS + 30 * k))
    assert timeline.rolled_up_through() == minute


@pytest.mark.parametrize("window", ["1h", "6h", "1d", "1w"])
def test_the_charts_queries_do_not_grow_with_buckets_or_minutes(operator_web, loaded, monkeypatch, window):
    def count() -> int:
        with CaptureQueriesContext(connection) as queries, monkeypatch.context() as at_now:
            at_now.setattr(timezone, "now", lambda: NOW)  # the page drawn when the load was
            page = operator_web.get(f"/console/endpoints/{loaded.pk}/live/?window={window}")
        assert page.status_code == 200 and page.content.decode().count('<svg class="chart"') == 3
        return len(queries)

    few = count()
    roll_up_until(TS, monkeypatch)
    assert TimelineMinute.objects.count() > 1000
    assert count() == few


def test_six_hours_draw_two_minute_bins_and_an_hour_fifteen_seconds():
    assert {w: bin_width(s) for w, s in charts.WINDOWS.items()} == {
        "15m": 5, "1h": 15, "6h": 120, "1d": 360, "1w": 2520,
    }  # fmt: skip


def charts_of(html: str) -> dict[str, str]:
    """The endpoint page's three charts by name, in the order drawn."""
    svgs = re.findall(r'<svg class="chart".*?</svg>', html, flags=re.S)
    return dict(zip(("replicas", "load", "latency"), svgs, strict=True))


def test_the_endpoint_charts_break_at_gaps_and_share_one_time_axis(operator_web, owner, make_endpoint):
    """Twenty minutes of load with a four-minute stack outage in them, and a single 48-s request
    in a quiet stretch: the lines break at the outage, the request is one dot (no ramp to its
    neighbours), and the three charts span the same minutes though latency starts later."""
    chat = make_endpoint(owner, "chat")
    now = int(timezone.now().timestamp()) // 5 * 5
    outage = range(now - 12 * 60, now - 8 * 60)
    request = now - 15 * 60
    slow = [0] * 15
    slow[12] = 1  # one request in (30, 60] s
    LoadBucket.objects.bulk_create(
        LoadBucket(
            endpoint=chat, end=end, seconds=5, in_flight=1.0, mu_per_minute=60.0,
            requests=int(end == request), queue_depth=0, latency_counts=slow if end == request else [],
            errors=0, throttled=0, ready_replicas=2, desired_replicas=2,
        )
        for end in range(now - 20 * 60, now + 1, 5)
        if end not in outage
    )  # fmt: skip
    drawn = charts_of(operator_web.get(f"/console/endpoints/{chat.pk}/live/").content.decode())
    assert drawn["replicas"].count('<polyline class="replicas"') == 2  # before and after the outage
    assert drawn["load"].count('<polyline class="sold"') == 2
    latency = drawn["latency"]
    assert "<polyline" not in latency and latency.count("<circle") == 2  # p50 and p99, one bin
    (hover,) = re.findall(r'<rect class="hover"[^>]*><title>([^<]*)</title>', latency)
    assert re.fullmatch(r"\d\d:\d\d:\d\d UTC\np50: 45 s\np99: 59.7 s", unescape(hover))
    ticks = {
        name: re.findall(r'<text class="tick x"[^>]*>([^<]*)</text>', svg) for name, svg in drawn.items()
    }
    assert ticks["replicas"] == ticks["load"] == ticks["latency"]
    assert len(ticks["replicas"]) >= 4  # twenty minutes of them, not the latency's fifteen alone


def test_an_endpoint_without_load_says_what_is_missing_instead_of_empty_charts(
    operator_web, owner, make_endpoint
):
    chat = make_endpoint(owner, "chat")
    html = operator_web.get(f"/console/endpoints/{chat.pk}/live/?window=15m").content.decode()
    assert '<svg class="chart"' not in html
    assert "No requests in the last 15m: p50 and p99 show once the routers meter one" in html
    assert html.count('<p class="chart-empty">') == 3
