"""Scenario tests of the vertical decider (target concurrency per replica), with worked numbers."""

from dataclasses import replace

from capacity.autoscaler import AutoscalerConfig, Bucket, decide_concurrency
from capacity.autoscaler.forecast import DAY, predicted_min_replicas, predicted_peak

T0 = 2_000_000.0
CFG = AutoscalerConfig(latency_slo_s=10.0)


def window(p99, kv=0.4, queue=0.0, in_flight=56.0, n=6):
    """The last 30 s as six 5-second buckets."""
    return [Bucket(T0 - 5 * i, 5, in_flight, 100.0, 10, queue, p99, kv) for i in range(n)][::-1]


def test_shrinks_fast_on_stable_overload():
    # p99 9.5 s against a 10 s SLO (over 90 %) in all buckets: 16 -> floor(16 x 0.75) = 12.
    assert decide_concurrency(16, 4, window(9.5), T0, CFG).target == 12
    # KV cache at 95 % is overload too; at target 2 the step is at least one: 2 -> 1.
    assert decide_concurrency(2, 4, window(1.0, kv=0.95), T0, CFG).target == 1


def test_latency_behind_a_router_backlog_does_not_shrink():
    # The same p99 9.5 s, but every bucket ends with 50 MU waiting at the router: the requests
    # waited for a replica (too few replicas), not in a too-large batch: hold 16.
    backlog = [replace(b, backlog_mu=50.0) for b in window(9.5)]
    decision = decide_concurrency(16, 4, backlog, T0, CFG)
    assert decision.target == 16 and "hold 16" in decision.reason
    # KV cache at 95 % behind the backlog: every replica is at its target because the fleet is
    # short (a burst of long answers fills the cache), not because the target is too large: hold.
    full = [replace(b, backlog_mu=50.0) for b in window(2.0, kv=0.95)]
    assert decide_concurrency(16, 4, full, T0, CFG).target == 16
    # Without the backlog the same KV cache is the replica's own overload: 16 -> 12.
    assert decide_concurrency(16, 4, window(2.0, kv=0.95), T0, CFG).target == 12


def test_a_backlog_anywhere_in_the_window_is_no_evidence():
    # A burst's backlog in the first bucket only; the requests that waited in it finish late
    # (p99 9.5 s) in the buckets after it, and the cache is full: all of it is the wait for
    # replicas, so the target holds at 16 (before: 16 -> 12, and never back: the ratchet).
    after = window(9.5, kv=1.0)
    after[0] = replace(after[0], backlog_mu=40.0)
    assert decide_concurrency(16, 4, after, T0, CFG).target == 16
    # The next window, the backlog gone and the latency still there: now it is evidence.
    assert decide_concurrency(16, 4, window(9.5), T0, CFG).target == 12


def test_a_single_spike_does_not_shrink():
    buckets = window(2.0)
    buckets[2] = Bucket(buckets[2].end, 5, 56.0, 100.0, 10, 0.0, 9.9, 0.4)
    assert decide_concurrency(16, 4, buckets, T0, CFG).target == 16


def test_grows_slowly_when_busy_fast_and_roomy_for_the_whole_window():
    # 7 of 8 per replica in use (>= 80 %), p99 2 s, KV 40 %, nothing waiting: 8 -> 9.
    assert decide_concurrency(8, 8, window(2.0), T0, CFG).target == 9
    # 40 -> +10 % = 44.
    assert decide_concurrency(40, 1, window(2.0, in_flight=38.0), T0, CFG).target == 44


def test_idle_replicas_do_not_grow_their_target():
    # Only 2 of 8 in use: fast because idle, which says nothing about a bigger batch.
    assert decide_concurrency(8, 8, window(2.0, in_flight=16.0), T0, CFG).target == 8


def test_queueing_is_overload():
    assert decide_concurrency(8, 2, window(3.0, queue=5.0), T0, CFG).target == 6


def test_stays_within_bounds():
    cfg = AutoscalerConfig(min_target_concurrency=4, max_target_concurrency=9)
    assert decide_concurrency(4, 4, window(9.9), T0, cfg).target == 4
    assert decide_concurrency(9, 8, window(1.0, in_flight=70.0), T0, cfg).target == 9


def test_missing_samples_or_replicas_mean_no_decision():
    assert decide_concurrency(8, 4, [], T0, CFG).target is None
    assert decide_concurrency(8, 4, window(2.0, n=2), T0, CFG).target is None
    assert decide_concurrency(8, 0, window(2.0), T0, CFG).target is None


def test_a_recurring_daily_peak_raises_the_minimum_ahead_of_it():
    # 09:00 peaks of 700, 650, 720 MU/min on the previous three days, 100 otherwise.
    nine = 9 * 3600.0
    history = []
    for day, peak in zip(range(3), (700, 650, 720), strict=True):
        for minute in range(24 * 60):
            t = day * DAY + minute * 60
            history.append((t, peak if nine <= t - day * DAY < nine + 300 else 100))
    now = 3 * DAY + nine - 300  # 08:55 on the fourth day
    assert predicted_peak(history, now) == 700  # the median of the three maxima
    assert predicted_min_replicas(history, now, 100, 0.7) == 10
    # A one-off spike on a single day is no pattern.
    spiky = [(t, 5000 if t == 2 * DAY + 4 * 3600 else v) for t, v in history]
    assert predicted_peak(spiky, 3 * DAY + 4 * 3600 - 300) == 100
    assert predicted_min_replicas(history[:1000], now, 100, 0.7) == 0  # under two days known
