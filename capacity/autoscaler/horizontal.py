"""The horizontal decider: how many replicas an endpoint needs, every 5 s. Pure.

    need = max((mu_per_minute + backlog_mu x 60 / backlog_drain_s) / (utilisation x mu_per_replica_minute),
               (in_flight + standing queue) / (utilisation x target_concurrency_per_replica))

40 MU/min against 80 % of 100 MU/min is 0.5 of a replica, 30 in flight against 80 % of 8 per
replica 4.69: the endpoint needs 5. A scale-up reads the last 20 s (its MU as the busiest 10 s), a
scale-down the highest MU need of the last 60 s and a burst's hold, never while the router holds
a backlog. Every margin here (0.8 of a replica, the busiest 10 s, the hold, the quiet margin) was
measured in the fleet simulator: re-measure with bench/autoscaler_policies.py before moving one.
Each rule and why, with figures: docs/autoscaler.md, "The horizontal decider".
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from capacity.autoscaler.calm import is_calm, is_quiet, work_spread_over
from capacity.autoscaler.config import AutoscalerConfig
from capacity.autoscaler.window import Bucket, Load, aggregate, running_sums
from capacity.units import MU_PER_REPLICA_MINUTE


@dataclass(frozen=True)
class EndpointSpec:
    min_replicas: int  # from provisioned concurrency; 0 only when scale to zero is allowed
    max_replicas: int  # >= min_replicas
    current_replicas: int  # what was last asked for (desired), >= 0
    target_concurrency_per_replica: int  # the vertical decider's value, >= 1
    mu_per_replica_minute: float = MU_PER_REPLICA_MINUTE  # a replica's capacity in MU/min, > 0
    scale_to_zero_enabled: bool = False
    predicted_min_replicas: int = 0  # from forecast, when predictive_min is on
    quiet_since: float | None = None  # no burst since (calm.quiet_since), when calm.horizon_s > 0
    config: AutoscalerConfig = field(default_factory=AutoscalerConfig)


@dataclass(frozen=True)
class Decision:
    replicas: int | None  # None: no decision (see reason)
    reason: str  # the numbers that caused it, for the Event
    need: float | None = None  # fractional replicas the last scale-up window asks for
    down_need: float | None = None  # the highest of need and the scale-down window's MU needs

    def changes(self, current: int) -> bool:
        return self.replicas is not None and self.replicas != current


def need_for(load: Load, spec: EndpointSpec, util: float | None = None) -> float:
    """Fractional replicas for a load: the larger of the MU answer (arrivals plus the router's
    backlog spread over `backlog_drain_s`) and the concurrency answer (at the replicas, plus the
    router's queue unless it drains, at most twice as many), each planned at `util` of a
    replica (by default the config's target_utilisation)."""
    cfg = spec.config
    util = cfg.target_utilisation if util is None else util
    mu = load.mu_per_minute + load.backlog_mu * 60.0 / cfg.backlog_drain_s
    by_mu = mu / (util * spec.mu_per_replica_minute)
    draining = load.queued_last < (1 - cfg.tolerance) * load.queued
    concurrency = load.in_flight + (0.0 if draining else min(load.queued, 2 * load.in_flight))
    by_concurrency = concurrency / (util * spec.target_concurrency_per_replica)
    return max(by_mu, by_concurrency)


def quiet_utilisation(cfg: AutoscalerConfig) -> float:
    """The share of a replica planned once no burst came for `quiet_after_s`: the margin
    (1 - target_utilisation) cut to `quiet_margin` of itself. Worked numbers: 0.8 with
    quiet_margin 0.5 -> 0.9; an operator's 0.6 -> 0.8; quiet_margin 1 -> 0.8, unchanged."""
    return 1.0 - (1.0 - cfg.target_utilisation) * cfg.quiet_margin


def decide(spec: EndpointSpec, buckets: Sequence[Bucket], now: float) -> Decision:
    cfg = spec.config
    current = spec.current_replicas
    recent = aggregate(buckets, now, cfg.scale_up_window_s)
    if recent is None or recent.coverage < cfg.min_coverage:
        covered = 0 if recent is None else round(recent.coverage * 100)
        return Decision(
            None, f"samples cover {covered}% of the last {cfg.scale_up_window_s:g} s: no decision"
        )
    calm_spell = is_calm(spec.quiet_since, now, cfg)
    spread = work_spread_over(buckets, now, cfg) if calm_spell else 0.0
    quiet = calm_spell and spread <= cfg.calm_max_spread
    settled = not quiet and is_quiet(spec.quiet_since, now, cfg)
    if quiet:  # no burst for calm_history_s, and steady work: plan at a full replica, hold none
        cfg = replace(cfg, target_utilisation=1.0, burst_memory_s=0.0)
        spec = replace(spec, config=cfg)
    # No burst for quiet_after_s: keep quiet_margin of the margin (no replace: the pass's CPU).
    planned = quiet_utilisation(cfg) if settled else cfg.target_utilisation
    spans_mu, down_coverage, busiest = _past_spans(spec, buckets, now)
    util = planned
    past = [mu / (util * spec.mu_per_replica_minute) for mu in spans_mu]
    # The MU rule reads the window's busiest `peak_window_s`, not its mean (see the docstring).
    recent = replace(recent, mu_per_minute=max(recent.mu_per_minute, busiest))
    need = need_for(recent, spec, util)
    # A past burst's hold is planned at a full replica: it is sized on the SLO's wait already.
    held = min(burst_hold(buckets, now, cfg) / spec.mu_per_replica_minute, cfg.burst_hold_cap * need)
    down_need = max([need, *past, held])
    floor = max(spec.min_replicas, spec.predicted_min_replicas, 0 if _idle(spec, buckets, now) else 1)
    low, high = min(floor, spec.max_replicas), spec.max_replicas
    waiting = f" + {recent.queued:.1f} waiting" if recent.queued else ""
    load = (
        f"{recent.mu_per_minute:.1f} MU/min and {recent.in_flight:.1f} in flight{waiting}"
        f" over {cfg.scale_up_window_s:g} s"
    )
    if quiet:
        load += f" (calm for {cfg.calm_history_s:g} s: planned at a full replica)"
    elif calm_spell:  # why an operator's calm history keeps the margins
        kept = "margins kept"
        if settled:
            kept = f"planned at {util:.2f} of a replica, not a full one"
        load += (
            f" (calm for {cfg.calm_history_s:g} s, but its work varies {spread:.2f} over"
            f" {cfg.burst_wait_s:g} s, above {cfg.calm_max_spread:g}: {kept})"
        )
    elif settled:
        load += f" (no burst for {cfg.quiet_after_s:g} s: planned at {util:.2f} of a replica)"
    # In a calm history the band holds a scale-down only: a need past the fleet is met at once.
    up_tolerance = 0.0 if quiet else cfg.tolerance

    if math.ceil(need) > current:
        cap = max(math.ceil(current * cfg.max_scale_up_factor), current + cfg.max_scale_up_step)
        if current > 0 and need / current <= 1 + up_tolerance:
            wanted, why = (
                current,
                f"{load} need {need:.2f} replicas, within the {cfg.tolerance:.0%} tolerance of {current}",
            )
        else:
            wanted = min(math.ceil(need), cap)
            capped = f", capped at {cap} this tick" if wanted < math.ceil(need) else ""
            why = f"{load} need {need:.2f} replicas -> {wanted}{capped}"
    elif math.ceil(down_need) < current:
        if down_coverage < cfg.min_coverage:
            wanted, why = (
                current,
                f"samples cover {down_coverage:.0%} of the last {cfg.scale_down_window_s:g} s:"
                f" no scale-down yet ({load})",
            )
        elif recent.backlog_mu > 0:
            wanted, why = (
                current,
                f"{recent.backlog_mu:.1f} MU wait at the router: no scale-down while a backlog waits",
            )
        elif down_need / current >= 1 - cfg.tolerance:
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


def lookback_s(cfg: AutoscalerConfig) -> float:
    """Seconds of buckets the decider reads back (its scale-down memory and the scale-up window
    before it, and the burst hold's spans of up to a pod start that end within `burst_memory_s`);
    the calm history's judgement reads its own (`calm.lookback_s`)."""
    memory = cfg.burst_memory_s + cfg.pod_start_s if cfg.burst_memory_s > cfg.scale_down_window_s else 0.0
    return max(cfg.scale_down_window_s, memory) + cfg.scale_up_window_s


def _past_spans(
    spec: EndpointSpec, buckets: Sequence[Bucket], now: float
) -> tuple[list[float], float, float]:
    """The MU/min (arrivals only) of every `peak_window_s` span that ended at a bucket in the
    scale-down window, the share of the scale-down window the buckets cover, and the busiest
    span's MU/min within the scale-up window (0 when none is covered enough).

    One pass with a sliding sum (the decider runs for every endpoint every 5 s: 10,000
    endpoints x 60 buckets must stay well under a second of CPU).
    """
    cfg = spec.config
    span, down = min(cfg.peak_window_s, cfg.scale_up_window_s), cfg.scale_down_window_s
    inside = sorted((b for b in buckets if now - down - span < b.end <= now), key=lambda b: b.end)
    spans: list[float] = []
    seconds = mu = covered = busiest = 0.0
    first = 0
    for b in inside:
        seconds += b.seconds
        mu += b.mu_per_minute * b.seconds
        while inside[first].end <= b.end - span:
            gone = inside[first]
            seconds -= gone.seconds
            mu -= gone.mu_per_minute * gone.seconds
            first += 1
        if b.end > now - down:
            covered += b.seconds
            if seconds >= cfg.min_coverage * span:
                spans.append(mu / seconds)
                if b.end > now - cfg.scale_up_window_s + span - 1e-9:
                    busiest = max(busiest, mu / seconds)
    return spans, min(covered / down, 1.0), busiest


def burst_hold(buckets: Sequence[Bucket], now: float, cfg: AutoscalerConfig) -> float:
    """MU/min that would serve again, within `burst_wait_s`, what arrived in any span of up to a
    pod start (5-s steps) that ended past the scale-down window and within `burst_memory_s`:
    the most of work(w) x 60 / (w + wait). A burst that recurs before new pods are ready is
    served only by what stands, and its requests may queue `burst_wait_s` for a first token, so
    this, not its peak rate, is what must stand (the caller caps it at `burst_hold_cap` x the
    current need). 0 when off.

    Worked numbers (wait 5 s, pod start 30 s): a 20-s burst at 1,600 MU/min 120 s ago, 400
    before and after: work(20 s) = 533 MU -> 533 x 60 / 25 = 1,280 MU/min, against the peak's
    1,600; work(30 s) = 600 MU -> 1,029; so 1,280. Steady traffic at r holds r x 30 / 35 < r:
    never more than the scale-down window holds already.
    """
    memory, down = cfg.burst_memory_s, cfg.scale_down_window_s
    if memory <= down:
        return 0.0
    step = 5.0  # the collector's bucket
    widths = [step * k for k in range(1, max(1, int(cfg.pod_start_s / step + 1e-9)) + 1)]
    ends, cum, _ = running_sums(buckets, now - memory - widths[-1], now)
    held = [i for i, end in enumerate(ends) if down < now - end < memory]
    if not held:
        return 0.0
    best = 0.0
    gaps = list(map(operator.sub, ends[1:], ends[:-1]))
    if not gaps or step - 1e-6 < min(gaps) <= max(gaps) < step + 1e-6:
        # Regular 5-s buckets (the collector's): a span of k buckets ending at i is cum[i + 1] -
        # cum[i + 1 - k], one slice per width (the decider's CPU budget: see _past_spans).
        lo, hi = held[0], held[-1] + 1
        for k, w in enumerate(widths, start=1):
            full = max(lo, k - 1)  # spans ending before it start before the first bucket: partial
            work = cum[min(hi, full)] - cum[0] if lo < full else 0.0
            if full < hi:  # operator.sub over two slices: the differences in C, not a generator
                ends_at, starts_at = cum[full + 1 : hi + 1], cum[full + 1 - k : hi + 1 - k]
                work = max(work, max(map(operator.sub, ends_at, starts_at)))
            best = max(best, work * 60.0 / (w + cfg.burst_wait_s))
        return best
    for i in held:
        for w in widths:
            first = bisect.bisect_right(ends, ends[i] - w + 1e-9)
            best = max(best, (cum[i + 1] - cum[first]) * 60.0 / (w + cfg.burst_wait_s))
    return best


def _idle(spec: EndpointSpec, buckets: Sequence[Bucket], now: float) -> bool:
    """True when scale to zero is allowed and the whole grace period saw no request at all."""
    if not spec.scale_to_zero_enabled:
        return False
    grace = spec.config.scale_to_zero_grace_s
    window = aggregate(buckets, now, grace) if grace > 0 else None
    if grace > 0 and (window is None or window.coverage < 0.9):
        return False  # without evidence of idleness, keep a replica
    return window is None or (window.requests == 0 and window.in_flight == 0)
