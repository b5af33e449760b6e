"""The horizontal decider's decisions in words: each outcome of `decide` on synthetic time, worded
by its rule with the decision's own figures, a sentence first, then the numbers."""

from dataclasses import replace

import pytest

from capacity.autoscaler import AutoscalerConfig, Rule, decide
from capacity.autoscaler.wording import detail, explain, headline
from tests.test_autoscaler_horizontal import T0, spec, steady


def test_a_scale_up_on_load_quotes_the_need_over_the_scale_up_window():
    # 20 s at 700 MU/min after 80: 700 / 80 = 8.75 -> 9.
    decision = decide(spec(1), steady(80, end=T0 - 20) + steady(700, start=T0 - 20), T0)
    assert decision.rule is Rule.LOAD
    assert headline(decision) == "scaled 1 -> 9: 8.8 replicas needed over the last 20 s"
    assert explain(decision).startswith("8.8 replicas needed over the last 20 s. Over the last 20 s:")
    assert "700.0 MU/min (its busiest 10 s) and 0.0 in flight: 8.75 replicas by MU" in explain(decision)
    # Beyond a tick's cap (10 from 1), it says so.
    burst = decide(spec(1), steady(80, end=T0 - 10) + steady(2000, start=T0 - 10), T0)
    assert headline(burst) == "scaled 1 -> 10: 25.0 replicas needed over the last 20 s, at most 10 this tick"


def test_a_need_is_rounded_up_so_it_never_reads_as_fewer_replicas_than_asked():
    # 19.264 in flight / 6.4 = 3.01 -> 4 replicas: "3.0 needed" would not explain the 4th.
    decision = decide(spec(1), steady(10, in_flight=19.264), T0)
    assert decision.replicas == 4
    assert headline(decision) == "scaled 1 -> 4: 3.1 replicas needed over the last 20 s"


def test_a_scale_down_quotes_the_highest_need_over_the_scale_down_window():
    # 700 MU/min until 60 s ago, 80 since: the busiest span left in the window holds a bucket of
    # 700 and one of 80, 390 / 80 = 4.875 -> 5.
    buckets = steady(700, end=T0 - 30) + steady(80, start=T0 - 30, end=T0 + 30)
    decision = decide(spec(9), buckets, T0 + 30)
    assert (decision.replicas, decision.rule) == (5, Rule.LOAD)
    assert headline(decision) == "scaled 9 -> 5: at most 4.9 replicas needed over the last 60 s"
    assert "over the last 60 s, arrivals: up to 4.88" in explain(decision)


def test_a_scale_down_after_a_scale_up_quotes_the_same_figures():
    """What a user saw: a scale-down 15 s after a scale-up quoted 1.59 over 60 s where the
    scale-up had said 2.29. The scale-up's need was the requests in flight, which the scale-down
    window does not remember (work drained does not come back): both events now quote both
    figures, so the second is read against the first."""
    calm = steady(80, in_flight=2.0, end=T0 - 20)
    up = decide(spec(2), calm + steady(80, in_flight=14.6, start=T0 - 20), T0)
    assert headline(up) == "scaled 2 -> 3: 2.3 replicas needed over the last 20 s"
    assert "1.00 replicas by MU, 2.28 by requests; over the last 60 s, arrivals: up to 1.00" in explain(up)
    later = (
        calm + steady(80, in_flight=14.6, start=T0 - 20) + steady(80, in_flight=2.0, start=T0, end=T0 + 20)
    )
    down = decide(spec(3), later, T0 + 20)
    assert headline(down) == "scaled 3 -> 1: at most 1.0 replicas needed over the last 60 s"
    assert "1.00 replicas by MU, 0.31 by requests; over the last 60 s, arrivals: up to 1.00" in explain(down)


def test_a_raised_minimum_is_why_it_scaled_not_the_load():
    # What a user saw: 15 s of samples (25 % of the scale-down window) and no load, from 1 with
    # the minimum raised to 2. The load alone would hold 1 (too few samples to shed it); the
    # minimum is what scaled it, and its event says so, not "no scale-down yet".
    decision = decide(spec(1, min_replicas=2), steady(0, requests=0, start=T0 - 15), T0)
    assert (decision.replicas, decision.rule, decision.wanted) == (2, Rule.MINIMUM, 1)
    assert headline(decision) == "scaled 1 -> 2: raised to the minimum 2"
    assert "samples cover" not in explain(decision) and detail(decision)["rule"] == "minimum"
    # A scale-down stopped at the minimum: the load's figure, then the bound.
    down = decide(spec(5, min_replicas=2), steady(40), T0)
    assert (
        headline(down)
        == "scaled 5 -> 2: at most 0.5 replicas needed over the last 60 s, held at the minimum 2"
    )


def test_a_lowered_maximum_is_why_it_scaled():
    decision = decide(spec(5, max_replicas=3), steady(320), T0)  # 320 / 80 = 4: hold 5 by load
    assert (decision.replicas, decision.rule) == (3, Rule.MAXIMUM)
    assert headline(decision) == "scaled 5 -> 3: lowered to the maximum 3"
    # A scale-up the maximum stops: the load's figure, then the bound.
    capped = decide(spec(3, max_replicas=4), steady(7000), T0)
    assert headline(capped) == "scaled 3 -> 4: 87.5 replicas needed over the last 20 s, held at the maximum 4"


def test_a_hold_says_what_holds_it():
    # 700 MU/min until 30 s ago, 80 now: the scale-down window still needs 8.75 -> hold 9.
    decision = decide(spec(9), steady(700, end=T0 - 30) + steady(80, start=T0 - 30), T0)
    assert (decision.replicas, decision.rule) == (9, Rule.LOAD)
    assert headline(decision) == (
        "held at 9: 1.0 replicas needed over the last 20 s, at most 8.8 replicas needed over the last 60 s"
    )
    # Need 840 / 80 = 10.5 with 10 running: inside the 10 % band.
    banded = decide(spec(10), steady(840), T0)
    assert (banded.replicas, banded.rule) == (10, Rule.TOLERANCE)
    assert headline(banded) == "held at 10: 10.5 replicas needed over the last 20 s, within 10% of 10"
    # No scale-down while a backlog waits.
    waiting = [replace(b, backlog_mu=10.0) for b in steady(80)]
    assert headline(decide(spec(8), waiting, T0)) == (
        "held at 8: 10.0 MU wait at the router: no scale-down while a backlog waits"
    )
    assert headline(decide(spec(4), [], T0)) == "samples cover 0% of the last 20 s: no decision"


def test_a_burst_hold_is_named_where_it_keeps_replicas():
    # 20 s at 700 MU/min 70 to 50 s before, 80 since: past the 60-s window the burst holds
    # 700 x 20 / 60 x 60 / 25 = 560 MU/min, capped at 1.75 x the need now (1): 1.75 -> 2.
    buckets = steady(80, end=T0 - 90) + steady(700, start=T0 - 90, end=T0 - 70) + steady(80, start=T0 - 70)
    decision = decide(spec(9), buckets, T0)
    assert (decision.replicas, decision.rule) == (2, Rule.BURST_HOLD)
    assert headline(decision) == (
        "scaled 9 -> 2: a burst within the last 300 s holds 1.8 replicas;"
        " at most 1.0 needed over the last 60 s"
    )
    assert "a burst within 300 s holds 1.75" in explain(decision)
    off = decide(spec(9, config=AutoscalerConfig(burst_memory_s=0.0)), buckets, T0)
    assert (off.replicas, off.rule) == (1, Rule.LOAD)


def test_the_quiet_margin_is_named_where_it_sets_the_need():
    # 450 MU/min for 40 min, no burst for 1,800 s: planned at 0.9 of a replica, 450 / 90 = 5.
    decision = decide(spec(4, quiet_since=T0 - 2400), steady(450, start=T0 - 2400), T0)
    assert headline(decision) == "scaled 4 -> 5: 5.0 replicas needed over the last 20 s (quiet margin)"
    assert explain(decision).endswith("no burst for 1800 s: planned at 0.90 of a replica")


@pytest.mark.parametrize("current", [1, 3])
def test_idle_past_the_grace_period_scales_to_zero(current):
    idle = steady(0, requests=0, start=T0 - 300)
    decision = decide(spec(current, min_replicas=0, scale_to_zero_enabled=True), idle, T0)
    assert (decision.replicas, decision.rule) == (0, Rule.SCALE_TO_ZERO)
    assert headline(decision) == f"scaled {current} -> 0: no request for 300 s and scale to zero is allowed"
