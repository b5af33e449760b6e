"""The horizontal decider: how many replicas an endpoint needs, every 5 s. Pure.

    need = max(mu_per_minute / (utilisation x mu_per_replica_minute),
               in_flight / (utilisation x target_concurrency_per_replica))

Worked numbers: 42 MU/min against 70 % of 100 MU/min is 0.6 of a replica -> 1; 30 requests in
flight against 70 % of 8 per replica is 5.36 -> 6; the endpoint needs max(1, 6) = 6 replicas.

Up fast, down slow: a scale-up follows the last 20 s, capped per tick at max(current x 2,
current + 4); a scale-down follows the *highest* recommendation of the last 5 min, so a dip does
not shed replicas a returning spike needs (no flapping). Within the tolerance band (need within
10 % of current) nothing moves. The result is clamped to the endpoint's [min, max]; it reaches
zero only when scale to zero is allowed and no request came for the grace period. No samples in
the scale-up window means no decision, never a scale to zero by accident.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from capacity.autoscaler.config import AutoscalerConfig
from capacity.autoscaler.window import Bucket, Load, aggregate


@dataclass(frozen=True)
class EndpointSpec:
    min_replicas: int  # from provisioned concurrency; 0 only when scale to zero is allowed
    max_replicas: int  # >= min_replicas
    current_replicas: int  # what was last asked for (desired), >= 0
    target_concurrency_per_replica: int  # the vertical decider's value, >= 1
    mu_per_replica_minute: float = 100.0  # a replica's capacity in MU/min, > 0
    scale_to_zero_enabled: bool = False
    predicted_min_replicas: int = 0  # from forecast, when predictive_min is on
    config: AutoscalerConfig = field(default_factory=AutoscalerConfig)


@dataclass(frozen=True)
class Decision:
    replicas: int | None  # None: no decision (see reason)
    reason: str  # the numbers that caused it, for the Event
    need: float | None = None  # fractional replicas the last scale-up window asks for
    down_need: float | None = None  # the highest need of the scale-down window

    def changes(self, current: int) -> bool:
        return self.replicas is not None and self.replicas != current


def need_for(load: Load, spec: EndpointSpec) -> float:
    """Fractional replicas for a load: the larger of the MU and the concurrency answers."""
    util = spec.config.target_utilisation
    by_mu = load.mu_per_minute / (util * spec.mu_per_replica_minute)
    by_concurrency = load.in_flight / (util * spec.target_concurrency_per_replica)
    return max(by_mu, by_concurrency)


def decide(spec: EndpointSpec, buckets: Sequence[Bucket], now: float) -> Decision:
    cfg = spec.config
    current = spec.current_replicas
    recent = aggregate(buckets, now, cfg.scale_up_window_s)
    if recent is None or recent.coverage < cfg.min_coverage:
        covered = 0 if recent is None else round(recent.coverage * 100)
        return Decision(
            None, f"samples cover {covered}% of the last {cfg.scale_up_window_s:g} s: no decision"
        )
    need = need_for(recent, spec)
    down_need = max([need, *_past_needs(spec, buckets, now)])
    floor = max(spec.min_replicas, spec.predicted_min_replicas, 0 if _idle(spec, buckets, now) else 1)
    low, high = min(floor, spec.max_replicas), spec.max_replicas
    load = (
        f"{recent.mu_per_minute:.1f} MU/min and {recent.in_flight:.1f} in flight"
        f" over {cfg.scale_up_window_s:g} s"
    )

    if math.ceil(need) > current:
        cap = max(math.ceil(current * cfg.max_scale_up_factor), current + cfg.max_scale_up_step)
        if current > 0 and need / current <= 1 + cfg.tolerance:
            wanted, why = (
                current,
                f"{load} need {need:.2f} replicas, within the {cfg.tolerance:.0%} tolerance of {current}",
            )
        else:
            wanted = min(math.ceil(need), cap)
            capped = f", capped at {cap} this tick" if wanted < math.ceil(need) else ""
            why = f"{load} need {need:.2f} replicas -> {wanted}{capped}"
    elif math.ceil(down_need) < current:
        if down_need / current >= 1 - cfg.tolerance:
            wanted, why = (
                current,
                f"highest need over {cfg.scale_down_window_s:g} s is {down_need:.2f}, within tolerance",
            )
        else:
            wanted = math.ceil(down_need)
            why = (
                f"highest need over {cfg.scale_down_window_s:g} s is {down_need:.2f} replicas"
                f" -> {wanted} ({load})"
            )
    else:
        wanted, why = current, f"{load} need {need:.2f} replicas; {current} hold it"

    clamped = min(max(wanted, low), high)
    if clamped != wanted:
        bound = "minimum" if clamped > wanted else "maximum"
        if (
            clamped == low
            and spec.predicted_min_replicas > spec.min_replicas
            and low == spec.predicted_min_replicas
        ):
            bound = "predicted minimum (a recurring peak is due)"
        why += f"; held at the {bound} {clamped}"
    if clamped == 0 and current > 0:
        why = f"no request for {cfg.scale_to_zero_grace_s:g} s and scale to zero is allowed -> 0"
    return Decision(clamped, why, need, down_need)


def _past_needs(spec: EndpointSpec, buckets: Sequence[Bucket], now: float) -> list[float]:
    """The need of every scale-up window that ended at a bucket in the last 5 min.

    One pass with a sliding sum (the decider runs for every endpoint every 5 s: 10,000
    endpoints x 60 buckets must stay well under a second of CPU).
    """
    cfg = spec.config
    up, down = cfg.scale_up_window_s, cfg.scale_down_window_s
    inside = sorted((b for b in buckets if now - down - up < b.end <= now), key=lambda b: b.end)
    util = cfg.target_utilisation
    per_mu = util * spec.mu_per_replica_minute
    per_request = util * spec.target_concurrency_per_replica
    needs: list[float] = []
    seconds = in_flight = mu = 0.0
    first = 0
    for b in inside:
        seconds += b.seconds
        in_flight += b.in_flight * b.seconds
        mu += b.mu_per_minute * b.seconds
        while inside[first].end <= b.end - up:
            gone = inside[first]
            seconds -= gone.seconds
            in_flight -= gone.in_flight * gone.seconds
            mu -= gone.mu_per_minute * gone.seconds
            first += 1
        if b.end > now - down and seconds >= cfg.min_coverage * up:
            needs.append(max(mu / seconds / per_mu, in_flight / seconds / per_request))
    return needs


def _idle(spec: EndpointSpec, buckets: Sequence[Bucket], now: float) -> bool:
    """True when scale to zero is allowed and the whole grace period saw no request at all."""
    if not spec.scale_to_zero_enabled:
        return False
    grace = spec.config.scale_to_zero_grace_s
    window = aggregate(buckets, now, grace) if grace > 0 else None
    if grace > 0 and (window is None or window.coverage < 0.9):
        return False  # without evidence of idleness, keep a replica
    return window is None or (window.requests == 0 and window.in_flight == 0)
