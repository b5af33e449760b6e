"""The oracle's lower bound (`minute_bounds`): each minute's fewest replicas, played alone.

What makes it a bound is that no schedule meets a minute with fewer: checked in context, on the
whole trace, for every minute of a decode-heavy and a lumpy prefill-heavy trace (5 minutes each,
synthetic time): the searched schedule with that one minute one replica under its bound misses
that minute."""

from dataclasses import replace

import pytest

from capacity.simulate.fleet import FleetConfig
from capacity.simulate.scenario import minute_bounds, searched_oracle, simulate
from capacity.simulate.sizing import chunk_within_itl
from capacity.simulate.traces import amplify, decode_heavy, prefill_heavy
from dataplane.runtime.profiles import get_profile

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
