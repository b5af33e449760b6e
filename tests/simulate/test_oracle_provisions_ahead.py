"""The oracle sizes each minute from the future arrivals and asks a pod start time ahead."""

import random

from capacity.simulate.fleet import FleetConfig, run
from capacity.simulate.policies import Schedule
from capacity.simulate.sizing import fit_shape, full_batch, oracle_schedule
from capacity.simulate.traces import Arrival
from engine_model.profiles import get_profile

TINY = get_profile("tiny-test")


def test_oracle_schedule_sizes_the_busiest_window_of_each_minute():
    # tiny-test, 100 in / 10 out, full batch 4, priced 100 x 0.1 ms + 10 x (1 ms + 10 ms / 4)
    # = 0.045 engine seconds each. Minute 0: 10 requests in 10 s = 0.045 replicas -> 1;
    # minute 1: 1,000 in 10 s = 4.5 replicas busy -> / 0.8 = 5.6 -> 6.
    trace = [Arrival(k, 100, 10) for k in range(10)] + [Arrival(60 + k / 100, 100, 10) for k in range(1000)]
    capacity = 60.0 / 0.6 / 60.0  # MU/s: one replica's full engine time at 0.6 s per MU
    assert oracle_schedule(TINY, trace, capacity, margin=0.8) == [1, 6]


def test_schedule_asks_a_pod_start_ahead():
    oracle = Schedule(per_minute=(3, 9), lead_s=30.0)
    assert [oracle.wanted(t) for t in (0.0, 29.0, 30.0, 61.0)] == [3, 3, 9, 9]


def test_oracle_replicas_are_ready_when_the_minute_starts():
    config = FleetConfig(pod_start_s=30.0, initial_replicas=3, min_replicas=1)
    trace = [Arrival(t, 20, 5) for t in range(0, 120, 2)]
    result = run(TINY, trace, Schedule(per_minute=(3, 9), lead_s=30.0), config, static_peak_replicas=9)
    minute0, minute1 = result.minutes[0], result.minutes[1]
    # Minute 0: 3 replicas for 30 s, then 9 (6 of them starting): a mean of ~6.
    assert 5.9 <= minute0.replicas <= 6.1
    assert minute1.replicas == 9.0


def test_full_batch_sums_the_fitted_shapes_kv():
    # full_batch sums min(p + o, max_model_len) in C; that is sum(fit_shape(p, o)) for p, o >= 1.
    rng = random.Random(3)
    h100 = get_profile("h100-llama-8b")
    shapes = [(rng.randint(1, 12_000), rng.randint(1, 12_000)) for _ in range(20_000)]
    trace = [Arrival(float(k), p, o) for k, (p, o) in enumerate(shapes)]
    total = sum(sum(fit_shape(h100, p, o)) for p, o in shapes)
    expected = max(1, min(h100.max_num_seqs, int(h100.kv_capacity_tokens // (total / len(shapes)))))
    assert full_batch(h100, trace) == expected
    assert full_batch(h100, [Arrival(0.0, 100, 100)]) == h100.max_num_seqs  # 200 tokens: slots bind
