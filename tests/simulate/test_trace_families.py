"""The production-like mixes: their shapes and burstiness match the parameters they
are generated from, for several seeds (what the policy bench replays)."""

import itertools
import math
import random

import pytest

from capacity.simulate.arrivals import LogNormalShape, _z
from capacity.simulate.traces import (
    FAMILY_RANGES,
    BurstFamily,
    amplify,
    burst_stats,
    decode_heavy,
    family_grid,
    long_context,
    prefill_heavy,
    surge,
)


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


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_burst_family_is_its_parameters_in_shape_rate_and_bursts(seed):
    family = BurstFamily(burst_s=30.0, height=8.0, gap_s=120.0, prompt_median=3000.0, output_median=20.0)
    seconds = 1200.0
    trace = family.trace(seed, seconds)
    stats = burst_stats(trace)
    assert stats["prompt_p50"] == pytest.approx(3000, rel=0.06)
    assert stats["prompt_p90"] == pytest.approx(3.5 * 3000, rel=0.1)
    assert stats["output_p50"] == pytest.approx(20, rel=0.1)
    spans = family.spans(seed, seconds)
    assert all(end - start == 30.0 for start, end in spans)
    assert all(0.1 * seconds <= start and end <= 0.9 * seconds for start, end in spans)
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(spans)]
    assert 60.0 <= sum(gaps) / len(gaps) <= 240.0  # exponential around 120 s
    inside = sum(1 for a in trace if any(s <= a.time_s < e for s, e in spans))
    burst_s = sum(e - s for s, e in spans)
    rate_in = inside / burst_s
    rate_out = (len(trace) - inside) / (seconds - burst_s)
    assert rate_in / rate_out == pytest.approx(8.0, rel=0.1)
    assert rate_out == pytest.approx(family.base_qps, rel=0.1)  # the wobble averages out


def test_a_family_s_base_carries_the_same_prompt_tokens_whatever_its_prompts():
    short, long = (BurstFamily(20.0, 4.0, 600.0, median, 10.0) for median in (1000.0, 8000.0))
    tokens = [sum(a.prompt_tokens for a in f.trace(1, 600.0)) for f in (short, long)]
    assert short.base_qps == pytest.approx(8 * long.base_qps)
    assert tokens[0] == pytest.approx(tokens[1], rel=0.15)


def test_a_family_with_gaps_longer_than_its_run_still_bursts_once():
    family = BurstFamily(burst_s=15.0, height=5.0, gap_s=3600.0, prompt_median=2000.0, output_median=10.0)
    assert [len(family.spans(seed, 1800.0)) >= 1 for seed in range(5)] == [True] * 5


def test_the_family_grid_takes_every_stratum_of_every_range_once():
    count = 8
    grid = family_grid(count, seed=4)
    assert len(set(grid)) == count
    for name, (low, high) in FAMILY_RANGES.items():
        strata = sorted(int(count * math.log(getattr(f, name) / low) / math.log(high / low)) for f in grid)
        assert strata == list(range(count)), name
    assert family_grid(count, seed=4) == grid and family_grid(count, seed=5) != grid
