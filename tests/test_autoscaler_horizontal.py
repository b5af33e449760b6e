"""Scenario tests of the horizontal decider on synthetic time, with worked numbers."""

import pytest

from capacity.autoscaler import AutoscalerConfig, Bucket, EndpointSpec, decide

T0 = 1_000_000.0


def steady(mu, in_flight=0.0, start=T0 - 300, end=T0, requests=10):
    """5-second buckets of a constant load from start to end."""
    t, out = start + 5, []
    while t <= end:
        out.append(Bucket(end=t, seconds=5, in_flight=in_flight, mu_per_minute=mu, requests=requests))
        t += 5
    return out


def spec(current, **kw):
    base = dict(min_replicas=1, max_replicas=50, current_replicas=current, target_concurrency_per_replica=8)
    return EndpointSpec(**{**base, **kw})


def test_need_is_the_larger_of_mu_and_concurrency():
    # 42 MU/min vs 70 % of 100 -> 0.6; 30 in flight vs 70 % of 8 = 5.6 -> 5.36 -> 6 replicas.
    decision = decide(spec(6), steady(42, in_flight=30), T0)
    assert decision.need == pytest.approx(30 / 5.6)
    assert decision.replicas == 6


def test_scale_up_follows_the_last_20_seconds():
    # Quiet at 70 MU/min (1 replica) for 5 min, then 20 s at 700 MU/min: need 10.
    buckets = steady(70, end=T0 - 20) + steady(700, start=T0 - 20)
    decision = decide(spec(1), buckets, T0)
    assert decision.need == pytest.approx(10)
    assert decision.replicas == 5  # capped: max(1 x 2, 1 + 4) = 5 this tick
    assert "capped at 5" in decision.reason
    assert decide(spec(5), buckets, T0 + 5).replicas == 10  # next tick: max(10, 9) allows 10


def test_scale_down_waits_for_the_highest_need_of_five_minutes():
    # 700 MU/min until 60 s ago, then 70: the 5-minute max still says 10.
    buckets = steady(700, end=T0 - 60) + steady(70, start=T0 - 60)
    assert decide(spec(10), buckets, T0).replicas == 10
    # 301 s after the drop only quiet windows remain: 70 / 70 = 1 replica.
    later = buckets + steady(70, start=T0, end=T0 + 301)
    decision = decide(spec(10), later, T0 + 301)
    assert decision.replicas == 1 and "300 s" in decision.reason


def test_a_short_dip_never_scales_down():
    # 20 s of silence inside steady traffic: the scale-down window remembers the traffic.
    buckets = steady(350, end=T0 - 20) + steady(0, start=T0 - 20, requests=0)
    assert decide(spec(5), buckets, T0).replicas == 5


def test_within_the_tolerance_band_nothing_moves():
    # Need 10.5 replicas with 10 running: 5 % over, inside the 10 % band.
    assert decide(spec(10), steady(735), T0).replicas == 10
    # Need 11.2: outside the band.
    assert decide(spec(10), steady(784), T0).replicas == 12


def test_clamped_to_the_provisioned_bounds():
    assert decide(spec(3, max_replicas=4), steady(7000), T0).replicas == 4
    decision = decide(spec(3, min_replicas=3), steady(7), T0 + 0)
    assert decision.replicas == 3 and "minimum 3" in decision.reason


def test_scale_to_zero_only_when_allowed_and_idle_past_the_grace_period():
    idle = steady(0, requests=0, start=T0 - 300)
    assert decide(spec(1, min_replicas=0, scale_to_zero_enabled=True), idle, T0).replicas == 0
    assert decide(spec(1, min_replicas=0, scale_to_zero_enabled=False), idle, T0).replicas == 1
    # One request 100 s ago keeps the replica.
    touched = [*idle[:40], Bucket(idle[40].end, 5, 0.0, 0.5, requests=1), *idle[41:]]
    assert decide(spec(1, min_replicas=0, scale_to_zero_enabled=True), touched, T0).replicas == 1


def test_no_samples_means_no_decision_not_zero():
    decision = decide(spec(4, min_replicas=0, scale_to_zero_enabled=True), [], T0)
    assert decision.replicas is None and "no decision" in decision.reason
    stale = steady(100, end=T0 - 60)  # the router stopped reporting a minute ago
    assert decide(spec(4, min_replicas=0, scale_to_zero_enabled=True), stale, T0).replicas is None


def test_scale_from_zero_takes_the_first_request():
    buckets = [*steady(0, requests=0, end=T0 - 5), Bucket(T0, 5, in_flight=1.0, mu_per_minute=3, requests=1)]
    decision = decide(spec(0, min_replicas=0, scale_to_zero_enabled=True), buckets, T0)
    assert decision.replicas == 1


def test_the_predicted_minimum_raises_the_floor():
    decision = decide(spec(2, predicted_min_replicas=8), steady(70), T0)
    assert decision.replicas == 8 and "predicted minimum" in decision.reason


def test_per_endpoint_overrides():
    # At 50 % target utilisation 350 MU/min needs 7 replicas instead of 5.
    cfg = AutoscalerConfig.from_overrides({"target_utilisation": 0.5})
    assert decide(spec(7, config=cfg), steady(350), T0).replicas == 7
    assert decide(spec(5), steady(350), T0).replicas == 5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"target_utilisation": 1.5}, "target_utilisation=1.5 is out of range"),
        ({"tolerance": -0.1}, "tolerance=-0.1 is out of range"),
        ({"scale_down_window_s": 10.0}, "scale_down_window_s=10.0 is out of range"),
        ({"max_scale_up_step": 2.5}, "max_scale_up_step=2.5 must be an integer"),
        ({"predictive_min": "yes"}, "predictive_min='yes' must be true or false"),
        ({"target_utilisaton": 0.5}, "unknown autoscaler setting 'target_utilisaton'"),
        ({"latency_slo_s": float("nan")}, "latency_slo_s=nan is out of range"),
    ],
)
def test_invalid_settings_are_refused_naming_key_and_value(overrides, message):
    with pytest.raises(ValueError, match=message):
        AutoscalerConfig.from_overrides(overrides)
