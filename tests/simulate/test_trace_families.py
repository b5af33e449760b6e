"""The production-like mixes: their shapes and burstiness match the parameters they
are generated from, for several seeds (what the policy bench replays)."""

import random

import pytest

from capacity.simulate.arrivals import LogNormalShape, _z
from capacity.simulate.traces import amplify, burst_stats, decode_heavy, long_context, prefill_heavy, surge


def test_z_is_the_normal_quantile():
    assert _z(0.5) == pytest.approx(0.0, abs=1e-9)
    assert _z(0.9) == pytest.approx(1.2816, abs=1e-4)
    assert _z(0.99) == pytest.approx(2.3263, abs=1e-4)


def test_a_shape_from_its_median_and_quantile():
    shape = LogNormalShape(1000, 0.9, 4000, 20, 0.9, 80, max_prompt=10**6, max_output=10**6)
    uniform = random.Random(3).random
    draws = sorted(shape(uniform)[0] for _ in range(20_000))
    assert draws[10_000] == pytest.approx(1000, rel=0.05)
    assert draws[18_000] == pytest.approx(4000, rel=0.08)


@pytest.mark.parametrize("seed", [1, 2])
def test_prefill_heavy_is_the_issues_public_trace_in_shape_and_bursts(seed):
    stats = burst_stats(amplify(prefill_heavy(seed, base_qps=1.5), 20.0, seed=seed))
    assert stats["prompt_p50"] == pytest.approx(1470, rel=0.06)
    assert stats["prompt_p90"] == pytest.approx(5200, rel=0.1)
    assert 11 <= stats["output_p50"] <= 15 and 48 <= stats["output_p90"] <= 62
    assert stats["peak_mean_10s"] >= 9  # the issue's ~13 per 10 s
    assert 3 <= stats["peak_mean_minute"] <= 8  # and ~4 per minute


@pytest.mark.parametrize("seed", [1, 2])
def test_long_context_reaches_tens_of_thousands_of_tokens_smoothly(seed):
    stats = burst_stats(long_context(seed, seconds=900.0))
    assert stats["prompt_p50"] == pytest.approx(6900, rel=0.08)
    assert stats["prompt_p99"] == pytest.approx(85_000, rel=0.25)
    assert stats["output_p50"] == pytest.approx(350, rel=0.08)
    assert stats["peak_mean_minute"] < 1.5  # smooth


@pytest.mark.parametrize("seed", [1, 2])
def test_decode_heavy_has_long_answers_and_fan_outs(seed):
    trace = decode_heavy(seed, seconds=900.0)
    stats = burst_stats(trace)
    assert stats["output_p50"] == pytest.approx(400, rel=0.06)
    assert stats["output_p50"] > stats["prompt_p50"] / 2
    assert stats["peak_mean_10s"] >= 2.5


def test_a_surge_adds_its_share_of_each_arrival_within_its_span_only():
    base = long_context(1, seconds=240.0)
    inside = sum(1 for a in base if 60.0 <= a.time_s < 120.0)
    doubled = surge(base, 2.0, 60.0, 60.0, seed=1)
    assert len(doubled) == len(base) + inside
    assert sum(1 for a in doubled if a.time_s < 60.0) == sum(1 for a in base if a.time_s < 60.0)
    # 1.5x: each arrival within the span copied with probability 0.5
    assert len(surge(base, 1.5, 60.0, 60.0, seed=1)) - len(base) == pytest.approx(inside / 2, rel=0.25)
    assert list(doubled.times) == sorted(doubled.times)
    with pytest.raises(ValueError, match=r"surge factor=1\.0 must be a finite number > 1"):
        surge(base, 1.0, 60.0, 60.0)
    with pytest.raises(ValueError, match=r"surge of 0 s from 60\.0 s"):
        surge(base, 2.0, 60.0, 0)
