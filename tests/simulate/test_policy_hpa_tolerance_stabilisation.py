"""Kubernetes HPA's rule: ceil(ready x metric / target), 10 % tolerance, up by max(4 pods, 100 %)
per sync, down only to the highest recommendation of the last 300 s."""

from capacity.simulate.policies import Hpa
from tests.simulate.support import buckets, state


def test_hpa_holds_within_the_tolerance():
    hpa = Hpa()
    # 4 pods at 73.5 in flight each against 70: ratio 1.05, inside 0.1 -> no change.
    assert hpa.decide(state(4), buckets(0, 15, in_flight=4 * 73.5), 15.0) == 4


def test_hpa_scales_up_by_the_ratio_capped_by_its_policies():
    hpa = Hpa()
    # 4 pods at 105 each: ratio 1.5 -> ceil(4 x 1.5) = 6.
    assert hpa.decide(state(4), buckets(0, 15, in_flight=4 * 105), 15.0) == 6
    # 4 pods at 700 each: ratio 10 -> 40, capped at max(4 + 4, 4 x 2) = 8 per 15 s.
    assert Hpa().decide(state(4), buckets(0, 15, in_flight=4 * 700), 15.0) == 8


def test_hpa_scale_down_waits_for_the_stabilisation_window():
    hpa = Hpa()
    high = buckets(0, 15, in_flight=8 * 70)  # 8 pods exactly at target: recommendation 8
    assert hpa.decide(state(8), high, 15.0) == 8
    history = list(high)
    t = 15.0
    while t < 15.0 + 285.0:  # load falls to 70 in total: raw recommendation 1
        history += buckets(t, t + 15, in_flight=70)
        t += 15.0
        assert hpa.decide(state(8), history, t) == 8, t
    history += buckets(t, t + 15, in_flight=70)
    t += 15.0  # 315 s: the recommendation of 8 made at 15 s has left the 300 s window
    assert hpa.decide(state(8), history, t) == 1
