"""The vertical decider: each replica's target concurrency, every 30 s. Pure.

It reads the last 30 s of 5-second buckets. A bucket is *overloaded* when p99 latency passes
90 % of the SLO, or KV-cache usage passes 90 %, or more than one request per replica waits; it
has *room* when p99 is under half the SLO, KV-cache under 70 %, nothing waits, and the replicas
use at least 80 % of their target (growing the target of idle replicas proves nothing).
Latency in a bucket that ends with a backlog at the router (`backlog_mu` > 0) is no evidence
against the target: those requests waited for a free replica, too few replicas is the
horizontal decider's to fix, and shrinking the target would only lengthen the queue (a ratchet:
each burst would cut the target for good, as idle replicas never earn it back).

Shrink fast, grow slowly, only on stable signals: shrink when more than half the window's
buckets, the latest among them, are overloaded (target x 0.75, at least -1); grow when every
bucket has room (+10 %, at least +1); otherwise hold. Always within [min, max].

Worked numbers: target 16, p99 9.5 s against a 10 s SLO in 5 of 6 buckets -> 12; the same
with 50 MU waiting at the router in every bucket -> 16. Target 8, p99 2 s, KV 40 %, no queue,
7 in flight per replica for the whole 30 s -> 9.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from capacity.autoscaler.config import AutoscalerConfig
from capacity.autoscaler.window import Bucket, in_window


@dataclass(frozen=True)
class ConcurrencyDecision:
    target: int | None  # new target concurrency per replica; None: no decision
    reason: str


def decide_concurrency(
    target: int, ready_replicas: int, buckets: Sequence[Bucket], now: float, config: AutoscalerConfig
) -> ConcurrencyDecision:
    window = in_window(buckets, now, config.vertical_tick_s)
    covered = sum(b.seconds for b in window)
    if not window or covered < config.min_coverage * config.vertical_tick_s:
        return ConcurrencyDecision(
            None, f"too few samples in the last {config.vertical_tick_s:g} s: no decision"
        )
    if ready_replicas < 1:
        return ConcurrencyDecision(None, "no ready replica to measure: no decision")
    window.sort(key=lambda b: b.end)
    overloaded = [_overload(b, ready_replicas, config) for b in window]
    roomy = [_room(b, target, ready_replicas, config) for b in window]
    lo, hi = config.min_target_concurrency, config.max_target_concurrency
    if overloaded[-1] and sum(1 for o in overloaded if o) * 2 > len(overloaded):
        new = max(lo, min(target - 1, math.floor(target * config.shrink_factor)))
        if new < target:
            return ConcurrencyDecision(
                new,
                f"overloaded in {sum(map(bool, overloaded))} of {len(window)} buckets"
                f" ({overloaded[-1]}): target {target} -> {new}",
            )
        return ConcurrencyDecision(target, f"overloaded but already at the minimum {lo}")
    if all(roomy):
        new = min(hi, target + max(1, math.floor(target * config.grow_fraction)))
        if new > target:
            return ConcurrencyDecision(
                new,
                f"room in all {len(window)} buckets (busy, fast, KV and queue low): target {target} -> {new}",
            )
        return ConcurrencyDecision(target, f"room to grow but already at the maximum {hi}")
    return ConcurrencyDecision(
        target, f"signals mixed or not stable over {config.vertical_tick_s:g} s: hold {target}"
    )


def _overload(b: Bucket, replicas: int, c: AutoscalerConfig) -> str:
    """Why this bucket is overloaded, or '' when it is not."""
    if (
        b.p99_latency_s is not None
        and b.p99_latency_s > c.latency_high * c.latency_slo_s
        and b.backlog_mu <= 0
    ):
        return f"p99 {b.p99_latency_s:.2f} s > {c.latency_high:.0%} of the {c.latency_slo_s:g} s SLO"
    if b.kv_cache_usage is not None and b.kv_cache_usage > c.kv_cache_high:
        return f"KV cache {b.kv_cache_usage:.0%} > {c.kv_cache_high:.0%}"
    if b.queue_depth / replicas > c.queue_high_per_replica:
        return f"{b.queue_depth:g} waiting for {replicas} replicas"
    return ""


def _room(b: Bucket, target: int, replicas: int, c: AutoscalerConfig) -> bool:
    fast = b.p99_latency_s is not None and b.p99_latency_s < c.latency_low * c.latency_slo_s
    kv_ok = b.kv_cache_usage is None or b.kv_cache_usage < c.kv_cache_low
    busy = b.in_flight / (replicas * target) >= c.busy_utilisation
    return fast and kv_ok and b.queue_depth == 0 and busy
