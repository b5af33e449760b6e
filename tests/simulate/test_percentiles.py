"""Percentiles of a stream: within 0.05 % of the exact nearest-rank value, in bounded memory."""

import math
import random

import pytest

from capacity.simulate.percentiles import Percentiles


def exact(values, q):
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def test_worked_numbers():
    p = Percentiles()
    p.add(20.0)
    assert p.value(0.99) == 20.0078125  # the middle of [20.0, 20.015625): 1.25 x 2^4, 10 bits kept
    assert math.isnan(Percentiles().value(0.99))


def test_within_the_relative_error_of_the_exact_percentile_on_a_long_tail():
    rng = random.Random(4)
    values = [rng.lognormvariate(1.0, 1.5) for _ in range(20_000)]
    p = Percentiles()
    p.add_many(values[:10_000])
    for v in values[10_000:]:
        p.add(v)
    assert len(p) == 20_000
    for q in (0.5, 0.9, 0.99, 0.999, 1.0):
        assert p.value(q) == pytest.approx(exact(values, q), rel=5e-4)
    assert len(p._counts) < 20_000 / 2  # buckets, not values


def test_zero_and_inf_sort_at_the_ends():
    p = Percentiles()
    for v in [0.0, 1.0, 2.0, math.inf]:
        p.add(v)
    assert p.value(0.25) == 0.0
    assert p.value(0.75) == pytest.approx(2.0, rel=5e-4)
    assert p.value(1.0) == math.inf  # a rejected request is infinitely late
