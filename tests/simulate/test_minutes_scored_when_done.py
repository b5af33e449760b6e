"""A minute is scored once it is over and its last request has ended; then its numbers go, so a
simulated day keeps only the requests in flight, not 10^8 latencies."""

import pytest

from capacity.simulate.fleet import Fleet, FleetConfig
from capacity.simulate.policies import ScalingPolicy
from engine_model.profiles import get_profile

TINY = get_profile("tiny-test")


def test_a_minute_is_scored_when_its_last_request_ends():
    fleet = Fleet(TINY, ScalingPolicy(), FleetConfig(), batch=4, static_peak_replicas=1)
    now = 0.0
    while now < 59.5:
        now += 0.5
        fleet.tick(now, counting=True)
    # tiny-test: a 10-token prefill step (10 + 1 ms) gives the first token at 59.911, then 399
    # decode steps of 10 + 1 ms: done at 64.3 s, 4.4 s after arrival; deadline 5 + 0.1 x 400.
    fleet.arrive(59.9, 10, 400, 0)
    fleet.tick(60.0, counting=True)
    assert 0 not in fleet.minute_p99 and fleet.open_minutes[0].running == 1  # over, not done
    while now < 65.0:
        now += 0.5
        fleet.tick(now, counting=True)
    requests, worst, ttft, itl = fleet.minute_p99[0]
    # Scored on the worst of its deadlines: 4.4 / 45 end to end, 0.011 / (5 + 10 x 0.1 ms) to the
    # first token, and 11 ms a token against 0.1 s: the ITL's 0.11.
    assert requests == 1 and ttft == pytest.approx(0.011 / 5.001, rel=1e-6)
    assert itl == pytest.approx(0.11, rel=1e-6) and worst == itl > 4.4 / 45.0
    assert fleet.open_minutes == {}  # its latencies went to the run's percentiles
    assert len(fleet.latencies) == 1 and fleet.latencies.value(0.99) == pytest.approx(4.4, rel=5e-4)
