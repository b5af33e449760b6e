"""The routers' per-second samples, folded into each endpoint's 5-second LoadBuckets, and billed.

Routers write samples per endpoint per second (dataplane.wire.load_samples, the contract with
the routers) and say, every second, that they were up. Two stores hold them: Redis when
REDIS_URL is set, else the database (RouterSample rows posted to /api/v1/load-samples/, the
embedded default). The collector (controlplane.endpoints.collector) calls `collect`, which
reads the seconds of each finished 5-second slot and writes a LoadBucket per endpoint that has
replicas or traffic:

    30 requests in the slot, in-flight 2.0 in each of its 5 seconds, 6 MU in all, and 3 requests
    of 1.5 MU waiting for a pod in its last second -> in_flight 10 / 5 = 2.0 (at pods), queued
    3 / 5 = 0.6 (waiting), mu_per_minute 6 / 5 s x 60 = 72.0, requests 30, backlog_mu 1.5

A slot no router reported is missing data and gets no bucket (the autoscaler then decides
nothing); a slot routers reported without traffic gets a bucket of zeros (idleness, which is
what scale to zero needs to see). A second that arrives after its slot was collected (a router
that could not reach its sink) is in no bucket.

Billing does not follow the slots: each source's `bill` adds every router second it has not
billed yet to its endpoint's hours of usage (controlplane.endpoints.usage), however late it
came, exactly once. In the database a posted row is marked billed in the transaction that adds
it to usage; from Redis, the billing stream's entries are billed in one transaction with their
routers' marks (RouterMark) and deleted after it commits, so a pass that dies in between leaves
them to the next one, whose marks skip them.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections import defaultdict
from datetime import datetime
from typing import Protocol

from django.db import transaction

from capacity.autoscaler.window import quantile
from controlplane.endpoints import usage
from controlplane.endpoints.models import Endpoint, LoadBucket, RouterMark, RouterSample
from dataplane.wire.load_samples import (
    BILLING_STREAM,
    CATCH_UP_S,
    LATENCY_BUCKETS_S,
    EndpointSecond,
    RouterSecond,
    check_not_ahead,
    least_mu_squared,
    load_key,
    routers_key,
    stored_fields,
)

log = logging.getLogger("controlplane.collector")

BUCKET_S = 5
LAG_S = 2  # routers publish a second about a second after it ends
MAX_CATCH_UP_S = CATCH_UP_S  # after a pause, collect at most the last 6 minutes (the rows outlive it)

BILL_BATCH = 10_000  # router seconds (Redis) or rows (the database) billed per transaction

Rows = dict[tuple[int, int], EndpointSecond]  # (endpoint id, second) -> all routers' sum


class SecondsSource(Protocol):
    def read(self, endpoint_ids: list[int], first: int, last: int) -> tuple[set[int], Rows]:
        """(seconds some router reported, rows) for unix seconds first..last inclusive."""

    def bill(self, now: datetime) -> int:
        """Add up to BILL_BATCH of what routers sent and was not billed yet to usage, in one
        transaction; returns how many were billed (fewer than BILL_BATCH: none is left)."""


class RedisSeconds:
    MGET_KEYS = 1000  # keys per MGET: 5 s x 10,000 endpoints is 50 commands in one round trip

    def __init__(self, redis) -> None:  # type: ignore[no-untyped-def]
        self.redis = redis

    def read(self, endpoint_ids: list[int], first: int, last: int) -> tuple[set[int], Rows]:
        seconds = range(first, last + 1)
        cells = [(endpoint_id, second) for endpoint_id in endpoint_ids for second in seconds]
        keys = [routers_key(second) for second in seconds] + [load_key(e, s) for e, s in cells]
        pipe = self.redis.pipeline(transaction=False)
        for i in range(0, len(keys), self.MGET_KEYS):
            pipe.mget(keys[i : i + self.MGET_KEYS])
        values = [v for chunk in pipe.execute() for v in chunk]
        observed = {s for s, v in zip(seconds, values, strict=False) if v}
        rows: Rows = {
            cell: EndpointSecond.from_redis_slots(raw)
            for cell, raw in zip(cells, values[len(seconds) :], strict=True)
            if raw
        }
        return observed, rows

    def bill(self, now: datetime) -> int:
        entries = self.redis.xrange(BILLING_STREAM, count=BILL_BATCH)
        # By (router, second), the first entry of each: the stream holds a second twice when its
        # router's mark in Redis was lost (evicted, expired, a failover) before a retry of it.
        posted: dict[tuple[str, int], RouterSecond] = {}
        for entry_id, fields in entries:
            try:
                second = RouterSecond.from_json(json.loads(fields[b"second"]))
                check_not_ahead(second.second, now.timestamp())  # it would skip its router's next ones
            except (KeyError, ValueError) as exc:  # not a router's: it would block the stream
                log.error("billing stream entry %s dropped: %s", entry_id, exc)
            else:
                posted.setdefault((second.router, second.second), second)
        with transaction.atomic():
            taken = RouterMark.take(posted, now)
            usage.record(
                (s.endpoint, p.second, EndpointSecond.from_fields(s.fields()))
                for key, p in posted.items()
                if key in taken
                for s in p.samples
            )
        if entries:  # billed, or skipped as billed before: gone either way
            self.redis.xdel(BILLING_STREAM, *(entry_id for entry_id, _ in entries))
        return len(entries)


class DatabaseSeconds:
    def read(self, endpoint_ids: list[int], first: int, last: int) -> tuple[set[int], Rows]:
        samples = RouterSample.objects.filter(second__gte=first, second__lte=last).values_list(
            "second", "endpoint_id", "fields"
        )
        wanted = set(endpoint_ids)
        observed: set[int] = set()
        rows: Rows = {}
        for second, endpoint_id, fields in samples:
            if endpoint_id == 0:
                observed.add(second)
            elif endpoint_id in wanted:  # several routers, tenants: their sum
                load = EndpointSecond.from_fields(fields)
                row = rows.get((endpoint_id, second))
                rows[(endpoint_id, second)] = load if row is None else row + load
        return observed, rows

    def bill(self, now: datetime) -> int:
        with transaction.atomic():
            rows = list(
                RouterSample.objects.select_for_update()
                .filter(billed=False)
                .order_by("id")
                .values_list("id", "second", "endpoint_id", "fields")[:BILL_BATCH]
            )
            RouterSample.objects.filter(id__in=[row[0] for row in rows]).update(billed=True)
            usage.record(
                (endpoint_id, second, EndpointSecond.from_fields(f)) for _, second, endpoint_id, f in rows
            )
        return len(rows)

    @staticmethod
    def store(posted: RouterSecond, now: datetime) -> int | None:
        """One router's second: a heartbeat and its samples, once. None when its router's mark
        says it was stored before (a retry): nothing is added."""
        with transaction.atomic():
            if not RouterMark.take([(posted.router, posted.second)], now):
                return None
            # a heartbeat has nothing to bill
            objs = [RouterSample(second=posted.second, endpoint_id=0, router=posted.router, billed=True)]
            objs += [
                RouterSample(
                    second=posted.second,
                    endpoint_id=s.endpoint,
                    fields=stored_fields(s),
                    router=posted.router,
                )
                for s in posted.samples
            ]
            RouterSample.objects.bulk_create(objs)
        return len(objs) - 1


def source() -> SecondsSource:
    from django.conf import settings

    if settings.REDIS_URL:
        return RedisSeconds(redis_client(settings.REDIS_URL))
    return DatabaseSeconds()


@functools.cache
def redis_client(url: str):  # type: ignore[no-untyped-def]
    """One client (and connection pool) per process, not one per pass every 5 s."""
    import redis

    return redis.Redis.from_url(url)


def summarise(
    end: int, observed: int, seconds: list[EndpointSecond]
) -> dict[str, float | int | list[int] | None]:
    """Pure: a bucket's fields from the rows of its observed seconds (missing rows are zeros)."""
    total = sum(seconds, EndpointSecond())
    return {
        "end": end,
        "seconds": observed,
        # Requests at pods, and apart from them those waiting at the routers because every pod
        # is at its target concurrency: the horizontal decider weighs the two differently.
        "in_flight": total.inflight / observed,
        "queued": total.queued / observed,
        "mu_per_minute": total.mu / observed * 60.0,
        # Squares only where every request's are in them (a router before them sends none, and
        # in a rollout its MU shares the second with a new router's squares): else 0, not known
        # steady. Redis sums what routers write unchecked: squares below the least the bucket's
        # requests can have read as that least.
        "mu_squared_per_minute": (
            max(total.mu_squared, least_mu_squared(total.mu, total.requests))
            if total.mu_squared and total.squared_requests >= total.requests
            else 0.0
        )
        / observed
        * 60.0,
        "requests": round(total.requests),
        "queue_depth": max((row.queued for row in seconds), default=0.0),
        # A level, not a rate: what waits for a pod at the slot's end (the last second reported),
        # which the horizontal decider sizes replicas to drain.
        "backlog_mu": seconds[-1].queued_mu if seconds else 0.0,
        "p50_latency_s": quantile(total.latency_buckets, LATENCY_BUCKETS_S, 0.5),
        "p99_latency_s": quantile(total.latency_buckets, LATENCY_BUCKETS_S, 0.99),
        "latency_counts": [round(n) for n in total.latency_buckets],
        "errors": round(total.errors),
        "throttled": round(total.throttled),
    }


def collect(src: SecondsSource, cursor: int, now: float, endpoints: list[Endpoint]) -> int:
    """Write the LoadBuckets of the slots that ended after `cursor`; returns the new cursor.

    An endpoint gets a bucket when it has replicas or its routers saw traffic for it. (Usage is
    billed apart, by `bill`, deleted endpoints' too.)"""
    last_end = math.floor((now - LAG_S) / BUCKET_S) * BUCKET_S
    first_end = max(cursor + BUCKET_S, last_end - MAX_CATCH_UP_S + BUCKET_S)
    if first_end > last_end or not endpoints:
        return max(cursor, last_end)
    ids = [e.pk for e in endpoints]
    observed, rows = src.read(ids, first_end - BUCKET_S, last_end - 1)
    traffic: dict[int, set[int]] = defaultdict(set)
    for endpoint_id, second in rows:
        traffic[endpoint_id].add(second)
    # A slot collected before (a pass that ended before it could move the cursor) already has
    # its buckets: they are not written twice.
    done = set(
        LoadBucket.objects.filter(endpoint_id__in=ids, end__gte=first_end, end__lte=last_end).values_list(
            "endpoint_id", "end"
        )
    )
    buckets = []
    for end in range(first_end, last_end + 1, BUCKET_S):
        slot = [s for s in range(end - BUCKET_S, end) if s in observed]
        if not slot:
            continue  # no router reported: missing data, not idleness
        for e in endpoints:
            if (e.desired_replicas == 0 and not any(s in traffic[e.pk] for s in slot)) or (e.pk, end) in done:
                continue
            seconds = [rows.get((e.pk, s), EndpointSecond()) for s in slot]
            fields = summarise(end, len(slot), seconds)
            buckets.append(
                LoadBucket(
                    endpoint_id=e.pk,
                    ready_replicas=e.ready_replicas,
                    desired_replicas=e.desired_replicas,
                    **fields,
                )
            )
    LoadBucket.objects.bulk_create(buckets, ignore_conflicts=True)
    return last_end
