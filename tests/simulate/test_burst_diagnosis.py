"""What the frontier bench says of each burst (`diagnose`) and the per-second timeline it reads
(`run`'s `timeline`): the fleet a burst met, what the oracle held, when the policy asked for
more and when it came, the queue meanwhile, and whether the burst's minutes met the SLO."""

from dataclasses import replace

from capacity.simulate.fleet import FleetConfig, Result, Second
from capacity.simulate.scenario import Burst, diagnose, simulate
from capacity.simulate.sizing import chunk_within_itl
from capacity.simulate.traces import BurstFamily
from engine_model.profiles import get_profile

H100 = chunk_within_itl(replace(get_profile("h100-llama-8b"), max_model_len=131_072), 0.1)


def result(violating: tuple[int, ...]) -> Result:
    return Result("apa", 0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0, 0.0, 0, violating, ())


def test_a_burst_is_read_from_the_seconds_around_it():
    # 2 replicas until 130 s; 5 asked at 75 s, ready 30 s later; the queue peaks at 40 in the burst
    timeline = [
        Second(float(t), 2 if t < 75 else 5, 2 if t < 105 else 5, 40 if 70 <= t < 80 else 0)
        for t in range(1, 240)
    ]
    schedule = [2, 6, 6, 2]
    (burst,) = diagnose([(70.0, 90.0)], timeline, schedule, result(violating=(1,)))
    assert burst == Burst(70.0, 20.0, 2, 6, 5.0, 35.0, 40, False)
    (later,) = diagnose([(130.0, 140.0)], timeline, schedule, result(violating=(1,)))
    assert (later.had, later.needed, later.asked_s, later.came_s, later.met) == (5, 6, None, None, True)


def test_the_timeline_has_each_measured_second_of_the_fleet_a_policy_drove():
    family = BurstFamily(burst_s=20.0, height=10.0, gap_s=600.0, prompt_median=4000.0, output_median=10.0)
    trace = family.trace(1, 240.0)
    fleet = FleetConfig(pod_start_s=30.0)
    timeline: list[Second] = []
    run = simulate(H100, trace, "apa", fleet, warmup_s=60.0, timeline=timeline)
    assert [s.time_s for s in timeline] == [float(t) for t in range(1, len(timeline) + 1)]
    assert len(timeline) >= run.duration_s  # and on while the fleet drains
    assert all(s.ready <= s.desired for s in timeline)  # a draining replica is not ready
    (burst,) = diagnose(family.spans(1, 240.0), timeline, [1] * 5, run)
    # the burst is 10x a base of ~2.5 replicas: apa asks within its windows, pods take 30 s
    assert burst.asked_s is not None and burst.came_s is not None
    assert burst.came_s >= burst.asked_s + fleet.pod_start_s - 1
    assert burst.had == next(s.ready for s in timeline if s.time_s >= burst.start_s)
