"""The vertical decider: each replica's target concurrency, every 30 s. Pure.

It reads the last 30 s of 5-second buckets. A bucket is *overloaded* when p99 latency passes
90 % of the SLO, or KV-cache usage passes 90 %, or more than one request per replica waits; it
has *room* when p99 is under half the SLO, KV-cache under 70 %, nothing waits, and the replicas
use at least 80 % of their target (growing the target of idle replicas proves nothing).
A window in which the router held a backlog (`backlog_mu` > 0 in any of its buckets) is no
evidence against the target, neither its latency nor its KV cache nor its engines' queues:
while requests wait at the router every replica is at its target, so a burst of long answers
fills the KV cache and the requests that waited for a replica finish late (for up to their
latency after the backlog is gone, still inside the window). Too few replicas is the horizontal
decider's to fix, and shrinking the target would only lengthen the queue; worse, it is a
ratchet: the target grows back only when the replicas use 80 % of it, which the horizontal
decider, planning for 80 % of a replica, seldom lets them do, so each burst would cut it for
good. Measured (the decode-heavy mix, seed 1): two bursts cut the router's limit 246 -> 184
-> 138 for the rest of the trace, and the later bursts queued at the router behind it (7 minutes
missed; 5 with the target kept). A target too large for the KV cache still shrinks, in the
first window without a backlog.

Shrink fast, grow slowly, only on stable signals: shrink when more than half the window's
buckets, the latest among them, are overloaded (target x 0.75, at least -1); grow when every
bucket has room (+10 %, at least +1); otherwise hold. Always within [min, max].

Worked numbers: target 16, p99 9.5 s against a 10 s SLO in 5 of 6 buckets -> 12; the same
with 50 MU waiting at the router in every bucket, or only in the first -> 16. Target 8, p99
2 s, KV 40 %, no queue, 7 in flight per replica for the whole 30 s -> 9.
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
    queued = any(b.backlog_mu > 0 for b in window)  # the fleet was short: no evidence (above)
    overloaded = [_overload(b, ready_replicas, config, queued) for b in window]
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


def _overload(b: Bucket, replicas: int, c: AutoscalerConfig, queued: bool = False) -> str:
    """Why this bucket is overloaded, or '' when it is not (never in a window the router held a
    backlog in: see the module's docstring)."""
    if queued:
        return ""
    if b.p99_latency_s is not None and b.p99_latency_s > c.latency_high * c.latency_slo_s:
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
