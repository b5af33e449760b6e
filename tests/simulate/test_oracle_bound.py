"""The oracle's lower bound (`minute_bounds`): each minute's fewest replicas, played alone; and
the causal floor (`causal_floor`): what a policy that sees a burst only when it comes must hold.

What makes it a bound is that no schedule meets a minute with fewer: checked in context, on the
whole trace, for every minute of a decode-heavy and a lumpy prefill-heavy trace (5 minutes each,
synthetic time): the searched schedule with that one minute one replica under its bound misses
that minute. What makes the floor one: a fleet one replica under its standing replicas when a
burst starts misses the burst's minute in context, however fast it reacts."""

from dataclasses import replace

import pytest

from capacity.simulate.arrivals import Trace, from_rate
from capacity.simulate.fleet import FleetConfig, run
from capacity.simulate.policies import Schedule
from capacity.simulate.scenario import (
    CausalFloor,
    burst_minutes,
    burst_starts,
    causal_floor,
    minute_bounds,
    searched_oracle,
    simulate,
)
from capacity.simulate.sizing import chunk_within_itl
from capacity.simulate.traces import PREFILL_HEAVY, amplify, decode_heavy, prefill_heavy
from engine_model.profiles import get_profile

H100 = chunk_within_itl(replace(get_profile("h100-llama-8b"), max_model_len=131_072), 0.1)
WARMUP_S = 120.0


@pytest.mark.parametrize(
    "trace",
    [
        decode_heavy(1, seconds=300.0, bursts=0),
        amplify(prefill_heavy(1, seconds=300.0, base_qps=1.5, bursts=0), 20.0, seed=1),
    ],
    ids=["decode-heavy", "prefill-lumps"],
)
def test_no_minute_meets_with_one_replica_under_its_bound(trace):
    fleet = FleetConfig()
    searched = searched_oracle(H100, trace, fleet, warmup_s=WARMUP_S)
    assert searched.unmet == ()
    bounds = minute_bounds(H100, trace, searched.per_minute, fleet)
    assert len(bounds.per_minute) == len(searched.per_minute)
    assert all(low <= given for low, given in zip(bounds.per_minute, searched.per_minute, strict=True))
    assert bounds.gpu_hours(fleet) <= searched.result.gpu_hours
    for minute, low in enumerate(bounds.per_minute):
        if low < 2:
            continue
        under = list(searched.per_minute)
        under[minute] = low - 1
        result = simulate(H100, trace, "oracle", fleet, warmup_s=WARMUP_S, schedule=under)
        assert minute in result.violating_minutes, (minute, low, under)


def test_a_minute_without_arrivals_needs_no_replica():
    trace = [a for a in decode_heavy(1, seconds=180.0, bursts=0) if not 60.0 <= a.time_s < 120.0]
    bounds = minute_bounds(H100, trace, [4, 4, 4], FleetConfig())
    assert bounds.per_minute[1] == 0 and bounds.per_minute[0] > 0 and bounds.per_minute[2] > 0


def _paced(rates: list[tuple[float, float]]) -> Trace:
    """Evenly spaced arrivals: (seconds, requests per second) after each other."""
    trace, t = Trace(), 0.0
    for seconds, qps in rates:
        end = t + seconds
        while t < end - 1e-9:
            trace.append(t, 1000, 20)
            t += 1.0 / qps
        t = end
    return trace


def test_a_burst_starts_where_a_span_is_above_the_ratio_times_the_300_s_before():
    # 400 s at 3 a second (30 a span), then 10 s at 9 (3x the 300 s before: a burst), then 3 again
    assert burst_starts(_paced([(400, 3), (10, 9), (200, 3)]), 2.5) == [400.0]
    assert burst_starts(_paced([(400, 3), (10, 6), (200, 3)]), 2.5) == []  # 2x: none
    # a burst of three spans starts once; nothing is judged with under 150 s before it
    assert burst_starts(_paced([(400, 3), (30, 9), (200, 3)]), 2.5) == [400.0]
    assert burst_starts(_paced([(100, 3), (10, 9), (200, 3)]), 2.5) == []


def test_a_burst_s_minutes_are_those_its_first_60_s_overlap():
    floor = CausalFloor(per_minute=(3,) * 20, bursts=(340.0, 900.0, 1170.0), standing=9, runs=0)
    assert burst_minutes(floor) == (5, 6, 15, 19)  # [340, 400), [900, 960), [1170, 1200): 20 minutes
    assert burst_minutes(CausalFloor((3,), (), 0, 0)) == ()


def test_a_fleet_under_the_floor_when_a_burst_starts_misses_its_minute_however_fast_it_reacts():
    # 8 minutes of 5 QPS of prefill-heavy requests with a 20-s burst at 20x from 5:00
    trace = from_rate(lambda t: 100.0 if 300.0 <= t < 320.0 else 5.0, 480.0, 1, PREFILL_HEAVY)
    fleet = FleetConfig()
    searched = searched_oracle(H100, trace, fleet, warmup_s=WARMUP_S)
    bounds = minute_bounds(H100, trace, searched.per_minute, fleet)
    floor = causal_floor(H100, trace, bounds, fleet)
    assert floor.bursts == (300.0,)
    quiet = max(b for m, b in enumerate(bounds.per_minute) if m != 5)
    assert floor.standing > quiet
    # every minute where a burst may start (0.8-7.2 min: minutes 1-7) holds it standing
    assert floor.per_minute == (bounds.per_minute[0],) + (max(floor.standing, bounds.per_minute[5]),) * 7
    assert floor.gpu_hours(fleet) > bounds.gpu_hours(fleet)

    def burst_minute_met(standing: int) -> bool:
        # `standing` ready until the burst starts; ten times that asked at its first second
        react = Schedule(per_minute=(standing,) * 5 + (10 * standing,) * 3, lead_s=0.0, name="react")
        config = replace(fleet, initial_replicas=standing, max_replicas=10 * standing)
        return 5 not in run(H100, trace, react, config, standing).violating_minutes

    assert not burst_minute_met(floor.standing - 1)
    assert burst_minute_met(floor.standing)  # and the floor is not set above what it needs


def test_a_burst_beyond_the_fleets_ceiling_is_left_out_of_the_floor():
    trace = from_rate(lambda t: 100.0 if 300.0 <= t < 320.0 else 5.0, 480.0, 1, PREFILL_HEAVY)
    fleet = FleetConfig(max_replicas=2)  # the burst needs 8 (the test above)
    bounds = minute_bounds(H100, trace, [2] * 8, fleet)
    assert 5 in bounds.noisy  # it misses alone with all the fleet has
    floor = causal_floor(H100, trace, bounds, fleet)
    assert floor.bursts == (300.0,) and floor.standing == 0 and floor.per_minute == bounds.per_minute


def test_a_trace_without_bursts_is_floored_at_its_bounds():
    trace = decode_heavy(1, seconds=180.0, bursts=0)
    bounds = minute_bounds(H100, trace, [4, 4, 4], FleetConfig())
    floor = causal_floor(H100, trace, bounds, FleetConfig())
    assert floor.bursts == () and floor.standing == 0 and floor.per_minute == bounds.per_minute
