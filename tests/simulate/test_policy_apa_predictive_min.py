"""apa with the predictive minimum in the loop: it keeps each minute's MU/min and raises its
floor ahead of a peak that came at the same time on the previous days."""

from capacity.autoscaler import AutoscalerConfig
from capacity.simulate.policies import Apa
from tests.simulate.support import buckets, state

DAY = 86400.0
NINE = 9 * 3600.0


def history(
    days: int, peak_on: set[int], peak: float = 2400.0, base: float = 80.0
) -> list[tuple[float, float]]:
    """Per-minute MU/min over `days` days: `base`, and `peak` from 09:00 to 09:10 on `peak_on`."""
    return [
        (t, peak if t // DAY in peak_on and NINE < t % DAY <= NINE + 600 else base)
        for t in (60.0 * m for m in range(1, days * 1440 + 1))
    ]


def test_the_floor_rises_five_minutes_before_a_daily_peak():
    apa = Apa(mu_per_replica_minute=100.0, config=AutoscalerConfig(predictive_min=True))
    apa.history = history(2, peak_on={0, 1})
    # Day 3, 08:55: the load is quiet (80 MU/min: need 1), but 09:00-09:05 peaked at 2,400 on both
    # days before: 2,400 / (0.8 x 100) = 30 replicas, asked for 300 s (forecast_lead_s) ahead.
    now = 2 * DAY + NINE - 300.0
    quiet = buckets(now - 80.0, now, mu_per_minute=80.0)
    assert apa.decide(state(1), quiet, now) == 30
    assert apa.predicted_min == 30
    # The minute was recorded: 80 MU/min.
    assert apa.history[-1] == (now, 80.0)


def test_without_the_predictive_minimum_the_quiet_load_keeps_one_replica():
    apa = Apa(mu_per_replica_minute=100.0)
    apa.history = history(2, peak_on={0, 1})
    now = 2 * DAY + NINE - 300.0
    assert apa.decide(state(1), buckets(now - 80.0, now, mu_per_minute=80.0), now) == 1


def test_a_peak_seen_on_one_day_of_three_does_not_raise_the_floor():
    # A one-off on day 1: the median of the slot's daily peaks (2,400, 80, 80) is 80 -> 1 replica.
    apa = Apa(mu_per_replica_minute=100.0, config=AutoscalerConfig(predictive_min=True))
    apa.history = history(3, peak_on={0})
    now = 3 * DAY + NINE - 300.0
    assert apa.decide(state(1), buckets(now - 80.0, now, mu_per_minute=80.0), now) == 1


def test_the_minute_is_recorded_once_a_minute():
    apa = Apa(mu_per_replica_minute=100.0, config=AutoscalerConfig(predictive_min=True))
    apa.decide(state(1), buckets(0, 60, mu_per_minute=120.0), 60.0)
    apa.decide(state(1), buckets(0, 65, mu_per_minute=120.0), 65.0)
    assert apa.history == [(60.0, 120.0)]
