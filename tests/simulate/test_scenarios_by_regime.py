"""apa against the oracle on each production-like regime, 8-minute traces on
synthetic time (the bench replays 30 minutes of each with more seeds; these keep the claims
the README makes about each regime from silently breaking).

- prefill-heavy, in lumps (20 copies of a heavy-tailed prompt within a second, no bursts):
  apa at most 2 minutes of 9 missed, within 1.25x the oracle's GPU-hours. Reading the 20-s
  mean (before the busiest-10-s rule) it missed 3 and 4 on these seeds.
- long contexts at a 128k context (KV-bound batches): every minute, within 1.25x.
- decode-heavy (long answers): every minute, within 1.25x.
- long contexts with a calm history (`calm_history_s`, its 10 minutes played as warm-up): their
  work is not steady (a 42k-126k-token prompt is seconds of one replica's prefill;
  `calm.work_spread_over`), so the default's margins stay and every minute is met at the default's
  GPU-hours. Planned at a full replica all the same (`calm_max_spread` unbounded) they take
  3-10 % fewer at the edge of the SLO, and the bench's 30-minute traces lose minutes there
  (docs/evaluation/autoscaler.md).
- long contexts after `quiet_after_s` without a burst (300 s here, within the warm-up): planned
  at 0.9 of a replica, not 0.8, they meet every minute for 7-10 % fewer GPU-hours (seed 3's 8
  minutes lose one, the margin's trade: 1 of 360 minutes on the bench's twelve 30-minute seeds).
"""

from dataclasses import replace

import pytest

from capacity.autoscaler import AutoscalerConfig
from capacity.simulate.fleet import FleetConfig
from capacity.simulate.scenario import simulate
from capacity.simulate.sizing import chunk_within_itl
from capacity.simulate.traces import amplify, decode_heavy, long_context, prefill_heavy
from engine_model.profiles import get_profile

# As the bench and the CLI deploy it: a 128k context, chunks within the 0.1-s ITL deadline.
H100 = chunk_within_itl(replace(get_profile("h100-llama-8b"), max_model_len=131_072), 0.1)


def _apa_and_oracle(trace):
    return simulate(H100, trace, "apa", FleetConfig()), simulate(H100, trace, "oracle", FleetConfig())


@pytest.mark.parametrize("seed", [1, 3])
def test_prefill_heavy_lumps(seed):
    trace = amplify(prefill_heavy(seed, seconds=480.0, base_qps=1.5, bursts=0), 20.0, seed=seed)
    apa, oracle = _apa_and_oracle(trace)
    assert oracle.slo_attainment == 1.0
    assert len(apa.violating_minutes) <= 2, apa.violating_minutes
    assert apa.gpu_hours <= 1.25 * oracle.gpu_hours


def test_long_contexts_at_128k():
    trace = long_context(1, seconds=480.0)
    assert max(trace.prompts) > 60_000  # a real long tail, replayed uncut
    apa, oracle = _apa_and_oracle(trace)
    assert apa.slo_attainment == 1.0 and apa.rejected_fraction == 0.0
    assert apa.gpu_hours <= 1.25 * oracle.gpu_hours


def test_decode_heavy():
    apa, oracle = _apa_and_oracle(decode_heavy(1, seconds=480.0, bursts=0))
    assert apa.slo_attainment == 1.0
    assert apa.gpu_hours <= 1.25 * oracle.gpu_hours


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_long_contexts_with_a_calm_history(seed):
    trace = long_context(seed, seconds=480.0)
    default = simulate(H100, trace, "apa", FleetConfig(), AutoscalerConfig(), warmup_s=600.0)
    calm = simulate(H100, trace, "apa", FleetConfig(), AutoscalerConfig(calm_history_s=600.0), warmup_s=600.0)
    unguarded = AutoscalerConfig(calm_history_s=600.0, calm_max_spread=1e9)
    anyway = simulate(H100, trace, "apa", FleetConfig(), unguarded, warmup_s=600.0)
    assert default.slo_attainment == calm.slo_attainment == 1.0
    assert calm.gpu_hours == default.gpu_hours
    assert anyway.gpu_hours <= 0.97 * default.gpu_hours


@pytest.mark.parametrize("seed", [1, 2])
def test_long_contexts_without_a_burst_keep_half_the_margin(seed):
    trace = long_context(seed, seconds=480.0)
    quiet = AutoscalerConfig(quiet_after_s=300.0)
    half = simulate(H100, trace, "apa", FleetConfig(), quiet, warmup_s=480.0)
    whole = simulate(H100, trace, "apa", FleetConfig(), replace(quiet, quiet_margin=1.0), warmup_s=480.0)
    assert half.slo_attainment == whole.slo_attainment == 1.0
    assert half.gpu_hours <= 0.93 * whole.gpu_hours
