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
from dataclasses import dataclass, field, replace
from enum import StrEnum

from capacity.autoscaler.calm import is_calm, is_quiet, work_spread_over
from capacity.autoscaler.config import AutoscalerConfig
from capacity.autoscaler.series import recurring
from capacity.autoscaler.window import Buckets, Load, Timeline, aggregate, running_sums
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
    series_level: float = 0.0  # MU/min a series carried past the burst memory holds (series.Series.level)
    config: AutoscalerConfig = field(default_factory=AutoscalerConfig)


class Rule(StrEnum):
    """What set a decision's replicas; its scale event names it (capacity.autoscaler.wording)."""

    NO_DATA = "no data"  # samples cover too little of the scale-up window
    LOAD = "load"  # the need: up on the scale-up window, down to the scale-down window's highest
    TOLERANCE = "tolerance"  # the need is within the band around the current replicas
    BURST_HOLD = "burst hold"  # a past burst holds more than the scale-down window needs
    COVERAGE = "coverage"  # samples cover too little of the scale-down window to shed any
    BACKLOG = "backlog"  # requests wait at the router: no scale-down
    MINIMUM = "minimum"
    PREDICTED_MINIMUM = "predicted minimum"  # a peak recurring at this time (forecast)
    ACTIVE = "active"  # a request came within the idle grace period: at least one replica
    MAXIMUM = "maximum"
    SCALE_TO_ZERO = "scale to zero"


@dataclass(frozen=True)
class Figures:
    """The decider's own figures over its windows, for the wording of its decision."""

    config: AutoscalerConfig  # the one planned with (a calm history's, where it dropped the margins)
    coverage: float  # share of the scale-up window the samples cover
    mu_per_minute: float = 0.0  # the scale-up window's, its busiest peak_window_s
    in_flight: float = 0.0
    queued: float = 0.0  # mean requests waiting at the router
    backlog_mu: float = 0.0  # MU waiting at the router now
    by_mu: float = 0.0  # replicas the MU rule needs over the scale-up window
    by_requests: float = 0.0  # replicas the concurrency rule needs over the scale-up window
    arrivals_need: float = 0.0  # the highest MU need of the scale-down window's spans
    held: float = 0.0  # replicas a past burst holds (burst_hold, capped; a series' need past the cap)
    down_coverage: float = 0.0  # share of the scale-down window the samples cover
    utilisation: float = 0.0  # the share of a replica planned for
    calm_spell: bool = False  # no burst for calm_history_s
    calm: bool = False  # ... and steady work: planned at a full replica, no hold
    quiet: bool = False  # no burst for quiet_after_s: quiet_margin of the margin
    spread: float = 0.0  # the work's variation over a first token's wait, in a calm spell
    cap: int | None = None  # the per-tick cap, where it bound a scale-up
    recurring: bool = False  # bursts recur within the hold's memory, or a series is carried past it
    carried: float = 0.0  # replicas a series of one level, carried past the memory, holds


@dataclass(frozen=True)
class Decision:
    replicas: int | None  # None: no decision (see rule)
    rule: Rule  # what set replicas
    current: int  # the replicas it was decided from
    figures: Figures
    wanted: int | None = None  # what the need asked, before the endpoint's bounds
    need: float | None = None  # fractional replicas the last scale-up window asks for
    down_need: float | None = None  # the highest of need and the scale-down window's MU needs

    def changes(self, current: int) -> bool:
        return self.replicas is not None and self.replicas != current


def needs_for(load: Load, spec: EndpointSpec, util: float, mu_per_minute: float) -> tuple[float, float]:
    """Fractional replicas for a load by MU (`mu_per_minute` arriving, the rate read off the
    load, plus the router's backlog spread over `backlog_drain_s`) and by concurrency (at the
    replicas, plus the router's queue unless it drains, at most twice as many), each planned at
    `util` of a replica."""
    cfg = spec.config
    mu = mu_per_minute + load.backlog_mu * 60.0 / cfg.backlog_drain_s
    by_mu = mu / (util * spec.mu_per_replica_minute)
    draining = load.queued_last < (1 - cfg.tolerance) * load.queued
    concurrency = load.in_flight + (0.0 if draining else min(load.queued, 2 * load.in_flight))
    by_concurrency = concurrency / (util * spec.target_concurrency_per_replica)
    return by_mu, by_concurrency


def quiet_utilisation(cfg: AutoscalerConfig) -> float:
    """The share of a replica planned once no burst came for `quiet_after_s`: the margin
    (1 - target_utilisation) cut to `quiet_margin` of itself. Worked numbers: 0.8 with
    quiet_margin 0.5 -> 0.9; an operator's 0.6 -> 0.8; quiet_margin 1 -> 0.8, unchanged."""
    return 1.0 - (1.0 - cfg.target_utilisation) * cfg.quiet_margin


def decide(spec: EndpointSpec, buckets: Buckets, now: float) -> Decision:
    cfg = spec.config
    current = spec.current_replicas
    buckets = Timeline.of(buckets)  # in order once; each window below is a slice of it
    recent = aggregate(buckets, now, cfg.scale_up_window_s)
    if recent is None or recent.coverage < cfg.min_coverage:
        covered = 0.0 if recent is None else recent.coverage
        return Decision(None, Rule.NO_DATA, current, Figures(cfg, covered))
    calm_spell = is_calm(spec.quiet_since, now, cfg)
    spread = work_spread_over(buckets, now, cfg) if calm_spell else 0.0
    quiet = calm_spell and spread <= cfg.calm_max_spread
    settled = not quiet and is_quiet(spec.quiet_since, now, cfg)
    if quiet:  # no burst for calm_history_s, and steady work: plan at a full replica, hold none
        cfg = replace(cfg, target_utilisation=1.0, burst_memory_s=0.0)
        spec = replace(spec, config=cfg)
    # No burst for quiet_after_s: keep quiet_margin of the margin (no replace: the pass's CPU).
    planned = quiet_utilisation(cfg) if settled else cfg.target_utilisation
    # A past burst's hold is planned at a full replica: it is sized on the SLO's wait already.
    hold = burst_hold(buckets, now, cfg) / spec.mu_per_replica_minute
    series = recurring(buckets, now, cfg) / spec.mu_per_replica_minute if hold > 0 else 0.0
    # A series carried past the memory (none in a calm spell, which holds nothing) is planned as
    # bursts recurring: the held fleet is the margin, and a burst's own need is asked without
    # one (its pods come after it; docs/autoscaler.md, "A series carried past the memory").
    carried = 0.0 if quiet else spec.series_level / spec.mu_per_replica_minute
    recurs = series > 0 or carried > 0
    if recurs:  # the held fleet is the margin: a replica's own goes
        planned = max(planned, cfg.recurring_utilisation)
    spans_mu, down_coverage, busiest = _past_spans(spec, buckets, now)
    util = planned
    past = [mu / (util * spec.mu_per_replica_minute) for mu in spans_mu]
    # The MU rule reads the window's busiest `peak_window_s`, not its mean (see the docstring).
    mu_per_minute = max(recent.mu_per_minute, busiest)
    by_mu, by_requests = needs_for(recent, spec, util, mu_per_minute)
    need = max(by_mu, by_requests)
    held = min(hold, cfg.burst_hold_cap * need)
    if recurs:  # the series' need, past the cap: no more than the hold itself, but a level carried
        held = max(held, min(hold, series), carried)
    arrivals = max(past, default=0.0)
    down_need = max(need, arrivals, held)
    floor = max(spec.min_replicas, spec.predicted_min_replicas, 0 if _idle(spec, buckets, now) else 1)
    low, high = min(floor, spec.max_replicas), spec.max_replicas
    # In a calm history the band holds a scale-down only: a need past the fleet is met at once.
    up_tolerance = 0.0 if quiet else cfg.tolerance
    # Without the hold, the need is this: where it sheds replicas the hold keeps, the hold decides.
    unheld = math.ceil(max(need, arrivals))

    rule, cap = Rule.LOAD, None
    if math.ceil(need) > current:
        limit = max(math.ceil(current * cfg.max_scale_up_factor), current + cfg.max_scale_up_step)
        if current > 0 and need / current <= 1 + up_tolerance:
            wanted, rule = current, Rule.TOLERANCE
        else:
            wanted = min(math.ceil(need), limit)
            cap = limit if wanted < math.ceil(need) else None
    elif math.ceil(down_need) < current:
        if down_coverage < cfg.min_coverage:
            wanted, rule = current, Rule.COVERAGE
        elif recent.backlog_mu > 0:
            wanted, rule = current, Rule.BACKLOG
        elif down_need / current >= 1 - cfg.tolerance:
            wanted, rule = current, Rule.TOLERANCE
        else:
            wanted = math.ceil(down_need)
            rule = Rule.BURST_HOLD if unheld < wanted else Rule.LOAD
    else:
        wanted = current
        rule = Rule.BURST_HOLD if unheld < current else Rule.LOAD

    clamped = min(max(wanted, low), high)
    if clamped == 0 and current > 0:
        rule = Rule.SCALE_TO_ZERO
    elif clamped > wanted:
        rule = Rule.MINIMUM
        if floor > spec.min_replicas:
            rule = Rule.PREDICTED_MINIMUM if floor == spec.predicted_min_replicas else Rule.ACTIVE
    elif clamped < wanted:
        rule = Rule.MAXIMUM
    figures = Figures(
        config=cfg,
        coverage=recent.coverage,
        mu_per_minute=mu_per_minute,
        in_flight=recent.in_flight,
        queued=recent.queued,
        backlog_mu=recent.backlog_mu,
        by_mu=by_mu,
        by_requests=by_requests,
        arrivals_need=arrivals,
        held=held,
        down_coverage=down_coverage,
        utilisation=util,
        calm_spell=calm_spell,
        calm=quiet,
        quiet=settled,
        spread=spread,
        cap=cap,
        recurring=recurs,
        carried=carried,
    )
    return Decision(clamped, rule, current, figures, wanted, need, down_need)


def lookback_s(cfg: AutoscalerConfig) -> float:
    """Seconds of buckets the decider reads back (its scale-down memory and the scale-up window
    before it, and the burst hold's spans of up to a pod start that end within `burst_memory_s`);
    the calm history's judgement reads its own (`calm.lookback_s`)."""
    memory = cfg.burst_memory_s + cfg.pod_start_s if cfg.burst_memory_s > cfg.scale_down_window_s else 0.0
    return max(cfg.scale_down_window_s, memory) + cfg.scale_up_window_s


def _past_spans(spec: EndpointSpec, buckets: Buckets, now: float) -> tuple[list[float], float, float]:
    """The MU/min (arrivals only) of every `peak_window_s` span that ended at a bucket in the
    scale-down window, the share of the scale-down window the buckets cover, and the busiest
    span's MU/min within the scale-up window (0 when none is covered enough).

    One pass with a sliding sum (the decider runs for every endpoint every 5 s: 10,000
    endpoints x 60 buckets must stay well under a second of CPU).
    """
    cfg = spec.config
    span, down = min(cfg.peak_window_s, cfg.scale_up_window_s), cfg.scale_down_window_s
    inside = Timeline.of(buckets).between(now - down - span, now)
    spans: list[float] = []
    seconds = mu = covered = busiest = 0.0
    first = 0
    # The loop's bounds, once (the pass's CPU budget).
    down_from, enough = now - down, cfg.min_coverage * span
    up_from = now - cfg.scale_up_window_s + span - 1e-9
    for b in inside:
        seconds += b.seconds
        mu += b.mu_per_minute * b.seconds
        while inside[first].end <= b.end - span:
            gone = inside[first]
            seconds -= gone.seconds
            mu -= gone.mu_per_minute * gone.seconds
            first += 1
        if b.end > down_from:
            covered += b.seconds
            if seconds >= enough:
                spans.append(mu / seconds)
                if b.end > up_from:
                    busiest = max(busiest, mu / seconds)
    return spans, min(covered / down, 1.0), busiest


def burst_hold(buckets: Buckets, now: float, cfg: AutoscalerConfig) -> float:
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
    # The buckets that ended past the scale-down window and within the memory: down < now - end <
    # memory, found by halving (ends are in order; end - now is -(now - end), the same float).
    lo = bisect.bisect_right(ends, -memory, key=lambda end: end - now)
    hi = bisect.bisect_left(ends, -down, key=lambda end: end - now)
    if lo >= hi:
        return 0.0
    best = 0.0
    gaps = list(map(operator.sub, ends[1:], ends[:-1]))
    if not gaps or step - 1e-6 < min(gaps) <= max(gaps) < step + 1e-6:
        # Regular 5-s buckets (the collector's): a span of k buckets ending at i is cum[i + 1] -
        # cum[i + 1 - k], one slice per width (the decider's CPU budget: see _past_spans).
        for k, w in enumerate(widths, start=1):
            full = max(lo, k - 1)  # spans ending before it start before the first bucket: partial
            work = cum[min(hi, full)] - cum[0] if lo < full else 0.0
            if full < hi:  # operator.sub over two slices: the differences in C, not a generator
                ends_at, starts_at = cum[full + 1 : hi + 1], cum[full + 1 - k : hi + 1 - k]
                work = max(work, max(map(operator.sub, ends_at, starts_at)))
            best = max(best, work * 60.0 / (w + cfg.burst_wait_s))
        return best
    for i in range(lo, hi):
        for w in widths:
            first = bisect.bisect_right(ends, ends[i] - w + 1e-9)
            best = max(best, (cum[i + 1] - cum[first]) * 60.0 / (w + cfg.burst_wait_s))
    return best


def _idle(spec: EndpointSpec, buckets: Buckets, now: float) -> bool:
    """True when scale to zero is allowed and the whole grace period saw no request at all."""
    if not spec.scale_to_zero_enabled:
        return False
    grace = spec.config.scale_to_zero_grace_s
    window = aggregate(buckets, now, grace) if grace > 0 else None
    if grace > 0 and (window is None or window.coverage < 0.9):
        return False  # without evidence of idleness, keep a replica
    return window is None or (window.requests == 0 and window.in_flight == 0)
