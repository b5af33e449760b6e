"""A replica's capacity at the SLO is measured on the fleet the trace needs, with its lumps:
a lone replica under-sold heavy-tailed prompts (every one stalls it), and one-by-one Poisson
arrivals over-sold lumps of copies that all prefill at once."""

import random
from dataclasses import replace

from capacity.simulate.sizing import lumps, slo_capacity_mu_per_s
from capacity.simulate.traces import amplify, long_context, prefill_heavy
from engine_model.profiles import get_profile

H100 = replace(get_profile("h100-llama-8b"), max_model_len=131_072)


def _capacity(trace, replicas=None):
    return slo_capacity_mu_per_s(H100, trace, 5.0, 0.1, seconds=120.0, replicas=replicas)


def test_lumps_are_the_copies_of_one_shape_within_a_second():
    base = prefill_heavy(1, seconds=120.0, base_qps=1.5, bursts=0)
    sizes = [len(offsets) for _, _, offsets in lumps(amplify(base, 20.0, seed=1), random.Random(0), 300)]
    assert 17 <= sum(sizes) / len(sizes) <= 21  # 20 copies; a few cut by the end or fused
    assert all(0.0 <= d < 1.0 for _, _, offsets in lumps(base, random.Random(0), 50) for d in offsets)
    assert {len(offsets) for _, _, offsets in lumps(base, random.Random(0), 200)} == {1}


def test_a_fleet_serves_more_heavy_tailed_prompts_per_replica_than_a_lone_replica():
    trace = long_context(1, seconds=240.0)
    assert _capacity(trace, replicas=4) > 1.05 * _capacity(trace, replicas=1)


def test_lumps_lower_the_rate_a_fleet_serves():
    base = prefill_heavy(2, seconds=240.0, base_qps=30.0, bursts=0)
    lumped = amplify(prefill_heavy(2, seconds=240.0, base_qps=1.5, bursts=0), 20.0, seed=2)
    assert _capacity(lumped, replicas=4) < 0.95 * _capacity(base, replicas=4)
