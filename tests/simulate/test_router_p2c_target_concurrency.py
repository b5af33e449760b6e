"""The router: power of two choices on in-flight MU, within each replica's concurrency limit;
beyond every limit a bounded queue; too long a wait is a rejection."""

from dataclasses import replace

from capacity.simulate.fleet import Fleet, FleetConfig, run
from capacity.simulate.policies import ScalingPolicy, Schedule
from capacity.simulate.traces import Arrival
from engine_model.profiles import get_profile

TINY = get_profile("tiny-test")


def _fleet(profile=TINY, **overrides) -> Fleet:
    config = FleetConfig(initial_replicas=2, target_concurrency=2, queue_timeout_s=1.0, **overrides)
    return Fleet(profile, ScalingPolicy(), config, batch=4, static_peak_replicas=2)


def _load(fleet: Fleet) -> list[tuple[int, float]]:
    return sorted((r.in_flight, round(r.in_flight_mu, 6)) for r in fleet.replicas)


def test_router_sends_to_the_replica_with_less_in_flight_mu():
    fleet = _fleet()
    fleet.arrive(0.00, 400, 100, 0)  # big: 0.0004 x 400 + ... MU, on either replica
    fleet.arrive(0.01, 10, 100, 1)  # the other replica holds 0 MU: it goes there
    assert [r.in_flight for r in fleet.replicas] == [1, 1]
    small = min(fleet.replicas, key=lambda r: r.in_flight_mu)
    fleet.arrive(0.02, 10, 100, 2)  # both hold 1 request; the small one holds less MU
    assert small.in_flight == 2


def test_router_counts_what_a_replica_has_not_begun_to_answer_twice():
    # As the router's p2c-mu: a 500-token prompt prefilling in chunks of 128 (first token at
    # ~0.09 s) holds 0.085 MU-seconds unanswered (load 0.17); a 10-token prompt answering 35
    # tokens holds 0.1235, its first token out at 0.011 s. At 0.02 s a new request goes to the
    # one answering, though it holds more MU in flight.
    fleet = _fleet(replace(TINY, max_batched_tokens=128))
    fleet.arrive(0.0, 500, 10, 0)
    prefilling = next(r for r in fleet.replicas if r.in_flight)
    assert prefilling.unanswered_mu == prefilling.in_flight_mu > 0
    fleet.arrive(0.0, 10, 35, 1)
    answering = next(r for r in fleet.replicas if r is not prefilling)
    assert answering.in_flight == 1 and answering.in_flight_mu > prefilling.in_flight_mu
    fleet.arrive(0.02, 10, 10, 2)
    assert (prefilling.in_flight, answering.in_flight) == (1, 2)
    assert prefilling.unanswered_mu > 0 and answering.unanswered_mu < answering.in_flight_mu
    fleet.tick(0.5, counting=True)  # every prompt prefilled: nothing is unanswered
    assert [round(r.unanswered_mu, 9) for r in fleet.replicas] == [0.0, 0.0]


def test_router_queues_beyond_every_limit_and_rejects_after_the_timeout():
    fleet = _fleet()
    for k in range(4):  # 2 replicas x target 2: full
        fleet.arrive(0.01 * k, 100, 400, k)
    assert _load(fleet)[0][0] == 2 and _load(fleet)[1][0] == 2
    fleet.arrive(0.1, 100, 400, 4)
    assert len(fleet.queue) == 1
    fleet.tick(0.5, counting=True)
    assert len(fleet.queue) == 1  # 400 tokens at >= 14 ms a step: nobody has finished
    fleet.tick(1.5, counting=True)  # waited 1.4 s > 1 s
    assert len(fleet.queue) == 0 and fleet.rejected == 1


def test_scaled_to_zero_holds_requests_until_a_pod_is_ready():
    config = FleetConfig(min_replicas=0, initial_replicas=0, pod_start_s=30.0, queue_timeout_s=60.0)
    trace = [Arrival(0.1, 50, 10), Arrival(59.0, 50, 10)]
    result = run(TINY, trace, Schedule(per_minute=(1,), lead_s=0.0), config, static_peak_replicas=1)
    assert result.rejected_fraction == 0.0
    # Asked for at the first tick (0.5 s), ready at 30.5 s: the first request waited ~30.4 s.
    assert 30.4 <= result.p99_latency_s <= 31.0


def test_router_meters_its_backlog_in_mu():
    # apa's horizontal decider drains what waits at the router (Bucket.backlog_mu, a level at the
    # bucket's end); hpa and kpa have no limit, so nothing waits there for them.
    fleet = _fleet()
    for k in range(5):  # 2 replicas x target 2 full, the fifth waits
        fleet.arrive(0.01 * k, 100, 400, k)
    waiting = fleet.queue[0].mu
    fleet.tick(0.5, counting=True)
    fleet.tick(1.0, counting=True)  # a whole second: the bucket closes
    assert fleet.buckets[-1].backlog_mu == waiting > 0
    fleet.tick(1.5, counting=True)  # waited 1.49 s > 1 s: rejected, nothing waits
    fleet.tick(2.0, counting=True)
    assert fleet.buckets[-1].backlog_mu == 0.0
