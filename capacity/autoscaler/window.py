"""Windowed aggregation of load samples. Pure.

The collector sums each endpoint's per-second router samples into 5-second buckets; a window
is the buckets that end within (now - seconds, now]. Averages weigh buckets by the seconds they
cover, so a missing bucket lowers coverage instead of pretending the load was zero. Requests
at the replicas (`in_flight`) and requests waiting at the router for one (`queued`) are kept
apart: the decider weighs them differently. The router's backlog is a level, not a rate: a
window's is its latest bucket's. A `Timeline` holds an endpoint's buckets in order of their end,
so that each window is a slice found by halving (a pass reads several windows of every endpoint
every 5 s); the functions that read buckets take one or a plain sequence.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import attrgetter, le
from typing import Any

by_end = attrgetter("end")  # the key that puts buckets in order of their end


@dataclass(frozen=True)
class Bucket:
    end: float  # unix seconds at the end of the bucket
    seconds: float  # how long it covers, normally 5; > 0
    in_flight: float  # time-averaged concurrent requests at the replicas, all together
    mu_per_minute: float  # model units consumed, as a per-minute rate
    requests: int = 0  # requests that arrived
    queue_depth: float = 0.0  # most requests waiting at once (router queue and engines)
    p99_latency_s: float | None = None  # end-to-end, of requests completed in the bucket
    kv_cache_usage: float | None = None  # highest KV-cache usage of any replica, 0..1
    errors: int = 0  # failed requests
    backlog_mu: float = 0.0  # MU of requests waiting at the router for a replica, at the bucket's end
    queued: float = 0.0  # time-averaged requests waiting at the router for a replica (not in in_flight)
    # each request's MU squared, summed, as a per-minute rate: with mu_per_minute, how lumpy the work is
    mu_squared_per_minute: float = 0.0


@dataclass(frozen=True)
class Load:
    """A window's aggregate."""

    seconds: float  # the window's length
    coverage: float  # share of the window the buckets cover, 0..1
    in_flight: float  # mean concurrent requests at the replicas
    mu_per_minute: float  # mean MU/min
    requests: int  # arrivals
    queue_depth: float  # max
    p99_latency_s: float | None  # max of the buckets' p99 (None without completions)
    kv_cache_usage: float | None  # max
    errors: int
    backlog_mu: float = 0.0  # the latest bucket's (a level, not a rate: what waits now)
    queued: float = 0.0  # mean requests waiting at the router
    queued_last: float = 0.0  # the latest bucket's: below the mean, the queue is draining
    mu_squared_per_minute: float = 0.0  # mean


class Timeline:
    """An endpoint's buckets in order of their end (stable: equal ends keep their order), and
    their ends apart. The collector's come in order: then it is one pass over their ends.
    `found`: what the pure readers of these buckets found, by what they read them with (a reader
    the pass asks twice, series.series_runs, reads them once)."""

    __slots__ = ("buckets", "ends", "found")

    def __init__(self, buckets: Iterable[Bucket]) -> None:
        ordered = list(buckets)  # its own: a caller's list changed later leaves it as it was
        ends = list(map(by_end, ordered))
        if not all(map(le, ends, islice(ends, 1, None))):
            ordered.sort(key=by_end)
            ends = list(map(by_end, ordered))
        self.buckets: list[Bucket] = ordered
        self.ends: list[float] = ends
        self.found: dict[tuple[Any, ...], Any] = {}

    @classmethod
    def of(cls, buckets: Buckets) -> Timeline:
        return buckets if isinstance(buckets, Timeline) else cls(buckets)

    def between(self, start: float, now: float) -> list[Bucket]:
        """The buckets that end within (start, now], in order (a new list)."""
        return self.buckets[bisect_right(self.ends, start) : bisect_right(self.ends, now)]


Buckets = Sequence[Bucket] | Timeline


def in_window(buckets: Buckets, now: float, seconds: float) -> list[Bucket]:
    """The buckets that end within (now - seconds, now], in order (a new list)."""
    return Timeline.of(buckets).between(now - seconds, now)


def aggregate(buckets: Buckets, now: float, seconds: float) -> Load | None:
    """The load over the last `seconds`; None when there are no samples at all."""
    inside = in_window(buckets, now, seconds)
    covered = sum(b.seconds for b in inside)
    if not inside or covered <= 0:
        return None
    latencies = [b.p99_latency_s for b in inside if b.p99_latency_s is not None]
    kv = [b.kv_cache_usage for b in inside if b.kv_cache_usage is not None]
    latest = inside[-1]
    return Load(
        seconds=seconds,
        coverage=min(covered / seconds, 1.0),
        in_flight=sum(b.in_flight * b.seconds for b in inside) / covered,
        mu_per_minute=sum(b.mu_per_minute * b.seconds for b in inside) / covered,
        requests=sum(b.requests for b in inside),
        queue_depth=max(b.queue_depth for b in inside),
        p99_latency_s=max(latencies) if latencies else None,
        kv_cache_usage=max(kv) if kv else None,
        errors=sum(b.errors for b in inside),
        backlog_mu=latest.backlog_mu,
        queued=sum(b.queued * b.seconds for b in inside) / covered,
        queued_last=latest.queued,
        mu_squared_per_minute=sum(b.mu_squared_per_minute * b.seconds for b in inside) / covered,
    )


def running_sums(buckets: Buckets, since: float, now: float) -> tuple[list[float], list[float], list[float]]:
    """The ends of the buckets in (since, now], in order, and the MU arrived and the seconds
    covered up to each one's end (both from 0 before the first): a span's work is a difference."""
    timeline = Timeline.of(buckets)
    first, last = bisect_right(timeline.ends, since), bisect_right(timeline.ends, now)
    work, covered = [0.0], [0.0]
    arrived = seconds = 0.0
    for b in timeline.buckets[first:last]:  # one loop, not a list each: the pass's CPU budget
        arrived += b.mu_per_minute * b.seconds / 60.0
        seconds += b.seconds
        work.append(arrived)
        covered.append(seconds)
    return timeline.ends[first:last], work, covered


def quantile(counts: Sequence[float], bounds: Sequence[float], q: float) -> float | None:
    """The q-quantile of a latency histogram, linear within a bucket (Prometheus'
    histogram_quantile). counts[i] falls in (bounds[i-1], bounds[i]]; the last count, above every
    bound, reads as the last bound. None for an empty histogram.

    Worked numbers: bounds (0.1, 1, 10), counts (50, 40, 10, 0): the 0.5 quantile is the end
    of the first bucket, 0.1 s; the 0.99 quantile is 90 % of the way into the third, 9.1 s.
    """
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    for i, n in enumerate(counts):
        if n > 0 and seen + n >= rank:
            if i >= len(bounds):
                return float(bounds[-1])
            low = 0.0 if i == 0 else float(bounds[i - 1])
            return low + (float(bounds[i]) - low) * (rank - seen) / n
        seen += n
    return float(bounds[-1])
