"""Celery tasks of the endpoints app: the collector, the timeline's roll-up and the routing
table's publication, thin wrappers. The autoscaler's passes and the pod mirror are controlplane.tasks."""

import time
from datetime import UTC, datetime

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from controlplane.endpoints import collector, routing, timeline
from controlplane.endpoints.models import (
    DeletedEndpoint,
    LoadBucket,
    RouterMark,
    RouterSample,
    TenantUsageDay,
    TenantUsageHour,
    UsageDay,
    UsageHour,
)
from controlplane.endpoints.samples import redis_client


@shared_task
def collect_load() -> str:
    """Beat, every 5 s: the routers' seconds into load buckets and usage, apart from the
    deciders (the horizontal pass also runs one first; the later of two is skipped)."""
    now = timezone.now()
    report = collector.collect_pass(now)
    if report is None:
        return "another pass holds the lease, or one ran less than half a tick ago"
    ts = int(now.timestamp())
    # Posted rows once billed; an unbilled one is billed first, however old.
    RouterSample.objects.filter(second__lt=ts - settings.ROUTER_SAMPLE_RETENTION_S, billed=True).delete()
    LoadBucket.objects.filter(end__lt=ts - settings.LOAD_BUCKET_RETENTION_S).delete()
    kept_since = ts - settings.USAGE_RETENTION_DAYS * 86400
    # A mark outlives the usage of every second it took: a router back after any outage with a
    # second it had delivered (its answer lost) finds it taken, or the hour it went to is gone too.
    RouterMark.objects.filter(updated_at__lt=datetime.fromtimestamp(kept_since, UTC)).delete()
    UsageHour.objects.filter(start__lt=kept_since).delete()
    TenantUsageHour.objects.filter(start__lt=kept_since).delete()
    for days in (UsageDay, TenantUsageDay):
        days.objects.filter(start__lte=kept_since - 86400).delete()  # a day goes with its last hour
    DeletedEndpoint.objects.filter(deleted_at__lt=datetime.fromtimestamp(kept_since, UTC)).delete()
    return f"collected through {report.collected}, {report.billed} billed"


@shared_task
def roll_up_timeline() -> str:
    """Beat, every 30 s: the minutes the collector has finished, summed for the endpoint page's
    day and week charts (controlplane.endpoints.timeline)."""
    done = timeline.roll_up(timezone.now())
    if done is None:
        return "another pass holds the lease, or one ran less than half a minute ago"
    return f"{done} minutes rolled up, through {timeline.rolled_up_through()}"


@shared_task
def publish_routing_table(force: bool = False) -> str:
    """Beat, every second with Redis: build the routing table once for every router and web
    worker, keep it in Redis, announce its version (controlplane.endpoints.routing.publish).
    ``force``: now, due or not (queued by a withdrawal: routing.withdraw_after_commit)."""
    if not settings.REDIS_URL:
        return "no Redis: the view builds the table for each poll"
    redis = redis_client(settings.REDIS_URL)
    if force:
        version = routing.publish(redis)
    else:
        version = routing.publish_due(redis, time.time(), settings.ROUTING_TABLE_PUBLISH_INTERVAL_S)
    return version or "not published: not due, or a withdrawal came after its read"
