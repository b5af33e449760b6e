"""A calm history: how long an endpoint's traffic has gone without a burst, carried as state. Pure.

A burst is a 10-s span (`CALM_SPAN_S`) that carried more than `burst_ratio` (2.5) x the mean
MU/min of the 300 s before it (`CALM_BASE_S`). An endpoint with none for `quiet_after_s` (30
minutes) is quiet: the horizontal decider keeps only `quiet_margin` of its margin (by default).
With none for `calm_history_s` (an operator's opt-in) it is calm, and there the decider drops its
margins for bursts (`horizontal.decide`).

The judgement is state, not a re-read: `quiet_since` is when the endpoint's calm began (the end
of the last burst span, or of the last span that could not be judged, or the first bucket when
judging began), and each pass judges only the spans that ended since the one before, so a pass
reads the 310 s before its newest buckets, not the whole history (30 minutes of buckets an
endpoint, read every 5 s, cost a pass over 10,000 endpoints 4.4 s of CPU against 0.9 s). An
endpoint judged for the first time is judged on what the pass reads anyway: its calm begins
there, and no pass ever reads further back for it.

Worked numbers (burst_ratio 2.5, calm_history_s 1800): five minutes at 400 MU/min, then a 10-s
span at 900: 2.25x, no burst; at 1,100: 2.75x, a burst ending at t, so quiet_since = t and the
endpoint is calm from t + 1800. A span whose 300 s before are under half covered by buckets
(a collector down for 150 s or more, an endpoint woken from zero) cannot be judged, and once
judging has begun it counts as a burst: what came in the gap is unknown.
"""

from __future__ import annotations

import bisect
import math

from capacity.autoscaler.config import AutoscalerConfig
from capacity.autoscaler.window import Buckets, Load, Timeline, aggregate, in_window, running_sums

CALM_SPAN_S = 10.0  # the spans a calm history judges, seconds
CALM_BASE_S = 300.0  # a span is judged against the mean of this long before it


def quiet_since(
    since: float | None, buckets: Buckets, after: float, now: float, cfg: AutoscalerConfig
) -> float | None:
    """The new `quiet_since` once the spans that ended in (after, now] are judged (each span ends
    at a bucket's end). `since` None: nothing was judged yet, so every span in `buckets` is, the
    first bucket's start begins the calm and spans before the first that can be judged are
    skipped; None again when there is no bucket. `buckets` must reach `CALM_BASE_S` +
    `CALM_SPAN_S` before the first span judged (`lookback_s`)."""
    buckets = Timeline.of(buckets)  # in order once, for the first bucket and the sums
    judging = since is not None
    if since is None:
        if not buckets.buckets:
            return None
        since, after = min(b.end - b.seconds for b in buckets.buckets), -float("inf")
    span = CALM_SPAN_S
    ends, work, covered = running_sums(buckets, min(after, now) - CALM_BASE_S - span, now)
    for i in range(bisect.bisect_right(ends, after), len(ends)):
        end = ends[i]
        first = bisect.bisect_right(ends, end - span + 1e-9)  # the span: buckets first..i
        base = bisect.bisect_right(ends, end - span - CALM_BASE_S + 1e-9)  # before it: base..first-1
        seconds = covered[first] - covered[base]
        if seconds < 0.5 * CALM_BASE_S:
            if judging:
                since = max(since, end)
            continue
        judging = True
        # A load from nothing is a burst too: any rate is above 2.5 x 0.
        rate = (work[i + 1] - work[first]) / max(covered[i + 1] - covered[first], 1e-9)
        if rate > cfg.burst_ratio * (work[first] - work[base]) / seconds:
            since = max(since, end)
    return since


def is_calm(since: float | None, now: float, cfg: AutoscalerConfig) -> bool:
    """True when the calm history is on and has lasted `calm_history_s` by `now`."""
    return cfg.calm_history_s > 0 and since is not None and now - since >= cfg.calm_history_s


def is_quiet(since: float | None, now: float, cfg: AutoscalerConfig) -> bool:
    """True when the quiet margin is on and no burst came for `quiet_after_s` by `now`."""
    return cfg.quiet_margin < 1 and since is not None and now - since >= cfg.quiet_after_s


def horizon_s(cfg: AutoscalerConfig) -> float:
    """The longest calm any setting waits for (`quiet_after_s`, `calm_history_s`); 0 when
    neither is on, and then nobody needs `quiet_since` judged."""
    return max(cfg.calm_history_s, cfg.quiet_after_s if cfg.quiet_margin < 1 else 0.0)


def lookback_s(cfg: AutoscalerConfig, after: float, now: float) -> float:
    """Seconds of buckets `quiet_since` reads back to judge the spans since `after`: those and
    the 310 s before them, at most `horizon_s` of spans (after a longer stall the spans it
    cannot reach restart the calm: their 300 s before are not there); none when off."""
    horizon = horizon_s(cfg)
    if horizon <= 0:
        return 0.0
    return min(max(now - after, 0.0), horizon) + CALM_BASE_S + CALM_SPAN_S


def work_spread(load: Load, horizon_s: float) -> float:
    """How much the work arriving within `horizon_s` varies, were arrivals Poisson with the
    load's request sizes: its coefficient of variation, sqrt(rate x E[mu^2] x h) / (rate x
    E[mu] x h), from the load's MU and MU squared per minute. 0 without work; infinite where
    MU came without its squares (a router that does not report them): not known to be steady.

    Worked numbers (h = 5 s): 600 MU/min of 0.1-MU requests (100 a second) carry 60 MU^2/min,
    1 a second: sqrt(1 x 5) / (10 x 5) = 0.045. The same 600 MU/min as one 10-MU request a
    second: sqrt(100 x 5) / 50 = 0.45, ten times as lumpy."""
    if load.mu_per_minute <= 0:
        return 0.0
    if load.mu_squared_per_minute <= 0:
        return math.inf
    rate, squares = load.mu_per_minute / 60.0, load.mu_squared_per_minute / 60.0
    return math.sqrt(squares * horizon_s) / (rate * horizon_s)


def work_spread_over(buckets: Buckets, now: float, cfg: AutoscalerConfig) -> float:
    """`work_spread` of the scale-down window over a first token's wait (`burst_wait_s`); infinite
    without buckets, or where any bucket has MU without squares (a router from before them, in a
    rollout: its MU would make the rest look steadier than it is). The calm history plans at a
    full replica only where it is at most `calm_max_spread`: a calm endpoint of long prompts is
    not steady, each is seconds of one replica's prefill, and a few at once hold every replica's
    first tokens."""
    buckets = Timeline.of(buckets)  # the check and the average read the same slice of it
    window = in_window(buckets, now, cfg.scale_down_window_s)
    if any(b.mu_per_minute > 0 and b.mu_squared_per_minute <= 0 for b in window):
        return math.inf
    load = aggregate(buckets, now, cfg.scale_down_window_s)
    return math.inf if load is None else work_spread(load, cfg.burst_wait_s)
