"""Knative's KPA: stable 60 s average against 70 per pod; a 6 s average at 200 % of the
ready pods' target panics, and a panicking KPA never scales down until 60 s pass calm."""

from capacity.simulate.policies import Kpa
from tests.simulate.support import buckets, state


def test_kpa_follows_the_stable_window():
    kpa = Kpa()
    # 140 in flight for 60 s against 70 per pod -> 2 pods.
    assert kpa.decide(state(3), buckets(0, 60, in_flight=140), 60.0) == 2
    assert kpa.panic_since is None


def test_kpa_panics_on_a_burst_and_holds_while_panicking():
    kpa = Kpa()
    calm = buckets(0, 54, in_flight=140)
    burst = buckets(54, 60, in_flight=300)
    # Panic window: 300 / 70 = 4.3 pods for 2 ready = 2.1 >= 2.0 -> panic, ceil(4.3) = 5.
    assert kpa.decide(state(2), calm + burst, 60.0) == 5
    assert kpa.panic_since == 60.0
    # Back to 140 in flight: not over the threshold, but within 60 s of the last panic -> hold 5.
    history = calm + burst + buckets(60, 100, in_flight=140)
    assert kpa.decide(state(5), history, 100.0) == 5
    # 61 s after the last over-threshold tick the panic ends and the stable window rules:
    # the 60 s average is 140 -> 2 pods, limited by max-scale-down-rate 2 to floor(5 / 2) = 2.
    history += buckets(100, 122, in_flight=140)
    assert kpa.decide(state(5), history, 122.0) == 2
    assert kpa.panic_since is None


def test_kpa_scale_down_is_limited_to_half_the_ready_pods_per_tick():
    kpa = Kpa()
    assert kpa.decide(state(10), buckets(0, 60, in_flight=70), 60.0) == 5
