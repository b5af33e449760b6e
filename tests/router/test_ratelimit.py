"""GCRA in model units on a fake clock, admission classes, and the in-process limiter."""

import asyncio

import pytest

from dataplane.router.ratelimit import (
    GcraLimit,
    InProcessLimiter,
    TrafficClass,
    classify,
    gcra,
    has_headroom,
    retry_after_header,
)

# 600 MU/min -> 0.1 s per MU; burst 10 s -> 100 MU
LIMIT = GcraLimit(mu_per_minute=600, burst_s=10)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_first_request_advances_tat_by_cost_times_interval():
    d = gcra(0.0, 0.0, 5.0, LIMIT)
    assert d.allowed and d.tat == pytest.approx(0.5)


def test_burst_of_twenty_5mu_requests_then_denied_with_retry_after():
    tat = 0.0
    for _ in range(20):
        d = gcra(tat, 0.0, 5.0, LIMIT)
        assert d.allowed
        tat = d.tat
    assert tat == pytest.approx(10.0)
    d = gcra(tat, 0.0, 5.0, LIMIT)
    assert not d.allowed and d.retry_after_s == pytest.approx(0.5) and d.tat == tat
    # after 0.5 s it conforms again
    assert gcra(tat, 0.5, 5.0, LIMIT).allowed


def test_sustained_rate_is_the_reservation():
    # one 5-MU request every 0.5 s is exactly 600 MU/min: always allowed, forever
    tat, now = 0.0, 0.0
    for _ in range(1000):
        d = gcra(tat, now, 5.0, LIMIT)
        assert d.allowed
        tat, now = d.tat, now + 0.5


def test_request_bigger_than_the_burst_runs_from_an_empty_bucket_only():
    d = gcra(0.0, 0.0, 500.0, LIMIT)  # 500 MU = 50 s of rate > 10 s burst
    assert d.allowed and d.tat == pytest.approx(50.0)
    d2 = gcra(d.tat, 1.0, 1.0, LIMIT)
    assert not d2.allowed and d2.retry_after_s == pytest.approx(50.1 - 1.0 - 10.0)


def test_negative_correction_cannot_bank_credit():
    d = gcra(0.0, 100.0, -50.0, LIMIT)
    assert d.allowed and d.tat == 100.0


def test_in_process_limiter_on_a_fake_clock_and_corrections():
    clock = Clock()
    lim = InProcessLimiter(clock)
    for _ in range(20):
        assert lim.check_now("ep1", 5.0, LIMIT).allowed
    assert not lim.check_now("ep1", 5.0, LIMIT).allowed
    assert lim.check_now("ep2", 5.0, LIMIT).allowed  # keys are independent
    # the 20 requests were priced at 5 MU but cost 1 MU each: refund 80 MU on the next check
    lim.correct("ep1", -80.0)
    d = lim.check_now("ep1", 5.0, LIMIT)
    assert d.allowed and d.tat == pytest.approx(clock.t + 10.0 - 8.0 + 0.5)
    clock.t += 60
    assert asyncio.run(lim.check("ep1", 5.0, LIMIT)).allowed


def test_classify_probe_reserved_best_effort_rejected():
    assert classify(True, True, False, False, False) is TrafficClass.PROBE
    assert classify(False, True, True, False, False) is TrafficClass.RESERVED
    assert classify(False, True, False, True, True) is TrafficClass.BEST_EFFORT
    assert classify(False, True, False, True, False) is TrafficClass.REJECTED  # no headroom
    assert classify(False, True, False, False, True) is TrafficClass.REJECTED  # best effort not allowed
    assert classify(False, False, False, True, True) is TrafficClass.BEST_EFFORT  # no reservation


def test_headroom_worked_numbers():
    assert has_headroom(700, 5, 800)  # 705 < 800
    assert not has_headroom(796, 5, 800)
    assert has_headroom(1e9, 5, float("inf"))


def test_retry_after_is_whole_seconds_at_least_one():
    assert retry_after_header(0.5) == "1"
    assert retry_after_header(2.1) == "3"
    assert retry_after_header(0) == "1"


def test_the_in_process_limiter_keeps_a_debt_through_idle_time():
    """60 s of R in one request, then 8.5 s idle: the next one still waits for the debt."""
    clock = Clock()
    lim = InProcessLimiter(clock)
    huge = 60 * 10.0  # 600 MU at 10 MU/s: 60 s
    assert lim.check_now("ep", huge, LIMIT).allowed
    clock.t += 8.5
    d = lim.check_now("ep", huge, LIMIT)
    assert not d.allowed and d.retry_after_s == pytest.approx(60 - 8.5 + 60 - 10)


def test_a_refund_is_applied_before_the_next_request_is_judged():
    """100 MU/min, burst 10 s: a 60-MU estimate (36 s of rate, larger than the burst) runs from the
    empty bucket and cost 0.12 MU; the refund leaves TAT 0.072 s, so a second 60-MU request at
    0.3 s finds the bucket empty and runs. Folded into the second request's cost, the first's
    estimate (TAT 36 s) refused it for 26 s while the tenant had used 0.12 MU of its minute."""
    limit = GcraLimit(mu_per_minute=100, burst_s=10)
    first = gcra(0.0, 0.0, 60.0, limit)
    assert first.allowed and first.tat == pytest.approx(36.0)
    second = gcra(first.tat, 0.3, 60.0, limit, correction_mu=0.12 - 60.0)
    assert second.allowed and second.tat == pytest.approx(0.3 + 36.0)
    # a charge (exact above the estimate) moves the TAT up first as well: 20 MU more at 600
    # MU/min is 2 s, so a 5-MU request at TAT 9 s is judged at 11.5 s and refused
    d = gcra(9.0, 0.0, 5.0, LIMIT, correction_mu=20.0)
    assert not d.allowed and d.retry_after_s == pytest.approx(1.5) and d.tat == 9.0


def test_the_in_process_limiter_admits_after_a_refund_of_a_large_estimate():
    clock = Clock()
    lim = InProcessLimiter(clock)
    limit = GcraLimit(mu_per_minute=100, burst_s=10)
    assert lim.check_now("ep", 60.0, limit).allowed  # max_tokens 3000 at 0.02 MU a token
    lim.correct("ep", 0.12 - 60.0)  # the engine stopped at once
    clock.t += 0.3
    assert lim.check_now("ep", 60.0, limit).allowed
    clock.t += 0.3
    refused = lim.check_now("ep", 60.0, limit)  # no refund this time: 36 s of rate are owed
    assert not refused.allowed and refused.retry_after_s == pytest.approx(36.0 - 0.3 - 10.0 + 36.0)
