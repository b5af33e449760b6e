"""The endpoint page's timeline over six hours and more: its 5-second load buckets summed per
minute (TimelineMinute), so a day's chart reads 1,440 rows, not 17,280 buckets with their
latency histograms. A minute is rolled up once, after the collector has written every bucket of
it (its cursor is at or past the minute's end: a slot it passed is never written again), by a
beat task under a lease of its own (`roll_up`), a few minutes a pass, catching up after a pause
from the oldest bucket kept; the chart reads the rolled-up minutes and, around them, the buckets
themselves (the minute the window's start cuts, what is not rolled up yet: `chart_rows`), so it
shows the same figures as from the buckets alone.
"""

import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from controlplane.endpoints import collector
from controlplane.endpoints.models import Endpoint, Lease, LoadBucket, TimelineMinute

TIMELINE = "timeline"  # the lease's name; its cursor: the end of the last minute rolled up
MINUTE = 60
MINUTES_PER_PASS = 3  # at 10,000 endpoints, 3 x 120,000 buckets a pass: a pause is caught up at 3x
# What timeline_bins (controlplane.console.views.endpoints) reads of a bucket, in this order.
BUCKET_FIELDS = ("end", "desired_replicas", "ready_replicas", "in_flight", "requests", "seconds", "queued",
                 "latency_counts")  # fmt: skip
Row = tuple[Any, ...]


def rolled_up_through() -> int:
    """The end of the last minute rolled up, unix s (0: none yet)."""
    return Lease.objects.filter(name=TIMELINE).values_list("cursor", flat=True).first() or 0


def roll_up(now: datetime) -> int | None:
    """Roll up the minutes the collector has finished since the last pass, up to
    MINUTES_PER_PASS of them, and delete those past the buckets' retention; returns the minutes
    rolled up, None when another pass holds the lease."""
    lease = Lease.take(TIMELINE, now, MINUTE / 2)
    if lease is None:
        return None
    ts = int(now.timestamp())
    kept_since = ts - settings.LOAD_BUCKET_RETENTION_S
    cursor = lease.cursor
    done = 0
    try:
        # from the oldest minute whose buckets are all kept, when behind or on the first pass
        start = max(cursor, math.ceil(kept_since / MINUTE) * MINUTE)
        finished = collector.collected_through() // MINUTE * MINUTE
        for end in range(start + MINUTE, min(finished, start + MINUTES_PER_PASS * MINUTE) + 1, MINUTE):
            with transaction.atomic():
                buckets = LoadBucket.objects.filter(end__gt=end - MINUTE, end__lte=end).order_by("end")
                TimelineMinute.objects.bulk_create(
                    minutes(
                        buckets.values_list("endpoint_id", *BUCKET_FIELDS).iterator(chunk_size=5000), end
                    ),
                    batch_size=2000,
                    ignore_conflicts=True,  # a pass that died after its commit left it there
                )
            cursor, done = end, done + 1
        TimelineMinute.objects.filter(end__lt=kept_since).delete()
    finally:
        lease.release(now, cursor)
    return done


def minutes(buckets: Iterable[Row], end: int) -> list[TimelineMinute]:
    """Pure: one minute's buckets (endpoint id, then BUCKET_FIELDS), ascending end, summed per
    endpoint: levels from the last bucket, the rest added."""
    rows: dict[int, TimelineMinute] = {}
    for endpoint_id, bucket_end, desired, ready, in_flight, requests, seconds, queued, counts in buckets:
        m = rows.get(endpoint_id)
        if m is None:
            m = rows[endpoint_id] = TimelineMinute(
                endpoint_id=endpoint_id, end=end, seconds=0, in_flight_s=0.0, requests=0, latency_counts=[]
            )
        m.last_end, m.desired_replicas, m.ready_replicas = bucket_end, desired, ready
        m.seconds += seconds
        m.in_flight_s += (in_flight + queued) * seconds
        m.requests += requests
        if counts:
            m.latency_counts = add_counts(m.latency_counts, counts)
    return list(rows.values())


def add_counts(a: list[int], b: list[int]) -> list[int]:
    """Two latency histograms added, the shorter read as zeros beyond its end."""
    longer, shorter = (a, b) if len(a) >= len(b) else (b, a)
    return [n + (shorter[i] if i < len(shorter) else 0) for i, n in enumerate(longer)]


def chart_rows(endpoint: Endpoint, since: float, until: float) -> list[Row]:
    """The endpoint's load after `since` as rows of BUCKET_FIELDS, ascending end, for bins of
    whole minutes: each rolled-up minute as one row (its last bucket's end, its levels, its
    in-flight as an average over its seconds, nothing queued apart), the buckets themselves
    before the first whole minute (or before the minutes kept: older buckets not deleted yet)
    and after the last one rolled up, and for the last minute before `until` (the page's
    figures of the last minute)."""
    first = math.ceil(max(since, until - settings.LOAD_BUCKET_RETENTION_S) / MINUTE) * MINUTE
    last = max(first, min(rolled_up_through(), math.floor((until - MINUTE) / MINUTE) * MINUTE))
    # Two ranges of the (endpoint, end) index, as one statement: ORed, the planner reads every
    # bucket of the endpoint's day.
    mine = LoadBucket.objects.filter(endpoint=endpoint).order_by().values_list(*BUCKET_FIELDS)
    buckets = list(mine.filter(end__gt=since, end__lte=first).union(mine.filter(end__gt=last), all=True))
    rolled = [
        (end, desired, ready, in_flight_s / seconds if seconds else 0.0, requests, seconds, 0.0, counts)
        for end, desired, ready, in_flight_s, requests, seconds, counts in TimelineMinute.objects.filter(
            endpoint=endpoint, end__gt=first, end__lte=last
        )
        .order_by("end")
        .values_list(
            "last_end",
            "desired_replicas",
            "ready_replicas",
            "in_flight_s",
            "requests",
            "seconds",
            "latency_counts",
        )
    ]
    return sorted([*buckets, *rolled], key=lambda row: row[0])
