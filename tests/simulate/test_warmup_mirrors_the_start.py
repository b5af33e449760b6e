"""The warm-up replays the trace's first minutes backwards, so the measured run starts from the
load it ends on: played forwards, the fleet came out of minute 4's load into minute 0's."""

from capacity.simulate.fleet import FleetConfig, warmup_time
from capacity.simulate.scenario import simulate
from capacity.simulate.traces import Arrival
from engine_model.profiles import get_profile

H100 = get_profile("h100-llama-8b")


def test_warmup_time_mirrors_and_stays_before_minute_0():
    assert [warmup_time(t, 300.0) for t in (10.0, 299.0)] == [290.0, 1.0]
    assert warmup_time(0.0, 300.0) < 300.0  # the first arrival is still warm-up, not measured


def test_a_busy_minute_0_after_quiet_minutes_is_met():
    # Minute 0 at 60 QPS of 2,000-token prompts, minutes 1-5 at 2 QPS. Forwards, the warm-up
    # ended on minute 4's 2 QPS, and apa's fleet of one or two replicas met minute 0's 60 QPS
    # with the pod start still ahead of it.
    busy = [Arrival(k / 60.0, 2000, 50) for k in range(3600)]
    quiet = [Arrival(60.0 + k / 2.0, 2000, 50) for k in range(600)]
    result = simulate(H100, busy + quiet, "apa", FleetConfig(pod_start_s=30.0))
    assert 0 not in result.violating_minutes, result.minutes[0]
