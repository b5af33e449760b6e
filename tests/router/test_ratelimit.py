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
