"""The long-request terms of the fit (rho: prefill stalls, kappa: KV token-steps) and its
one-sided guard against under-pricing, on families of generated workloads (several seeds). The
simulated profiles' own figures are bench/simulated_profile_fits.py's (a sweep each, too slow
for the suite on a busy machine)."""

import random

import pytest

from capacity.fitting import LONG_TERMS_MIN_SHAPES, Measurement, fit
from capacity.units import CostModel, kv_token_steps, prefill_stall, price

GRID = [(i, o) for i in (16, 128, 512, 2048) for o in (1, 16, 128, 512)] + [(50, 50)]


def test_the_price_rule_adds_the_long_request_terms_and_the_router_model_carries_them():
    assert kv_token_steps(2048, 512) == 512 * (2048 + 256) and prefill_stall(2048, 1) == 0
    assert price(0.0004, 0.004, 0.02, 50, 50) == pytest.approx(0.24)  # the headline alone
    model = CostModel(0.0004, 0.004, 0.02, rho=1e-6, kappa=1e-7)
    assert model.cost(2048, 512) == pytest.approx(0.8192 + 2.048 + 0.02 + 1e-6 * 2048 * 9 + 1e-7 * 1_179_648)
    with pytest.raises(ValueError, match="kappa"):
        CostModel(0, 0, 0, kappa=-1.0)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_generated_kv_bound_costs_are_recovered_within_their_intervals(seed):
    rng = random.Random(seed)
    truth = dict(alpha=rng.uniform(1e-4, 5e-4), beta=rng.uniform(1e-3, 5e-3), gamma=rng.uniform(0, 0.02),
                 rho=rng.uniform(0, 2e-6), kappa=rng.uniform(1e-8, 1e-7))  # fmt: skip
    model = CostModel(truth["alpha"], truth["beta"], truth["gamma"], rho=truth["rho"], kappa=truth["kappa"])
    noisy = [Measurement(i, o, 100 / (model.cost(i, o) * rng.uniform(0.99, 1.01))) for i, o in GRID]
    result = fit(noisy)
    assert result.heldout_mape < 0.02 and result.worst_underprice[0] > -0.05
    # The long corner is priced as the truth prices it, with a KV term whose interval is not (0, 0).
    assert result.predict(2048, 512) == pytest.approx(model.cost(2048, 512), rel=0.03)
    assert result.kappa > 0 and result.intervals["kappa"][1] > result.intervals["kappa"][0]


def test_a_region_that_measured_dear_is_not_under_priced():
    # A corner (long prompts and long answers) 25 % dearer than any smooth rule says: the plain
    # fit would split the difference; the one-sided fit prices it within 5 % (or above).
    base = CostModel(0.0002, 0.0005, 0.001)
    data = [
        Measurement(i, o, 100 / (base.cost(i, o) * (1.25 if i >= 512 and o >= 128 else 1))) for i, o in GRID
    ]
    result = fit(data)
    assert result.worst_underprice[0] >= -0.05
    ok, why = result.verdict(1.0, max_underprice=0.05)
    assert ok, why
    refused, why = fit(data, max_underprice=1.0).verdict(1.0, max_underprice=0.05)
    assert not refused and "below its measurement" in why


def test_few_shapes_fit_the_headline_three_alone():
    model = CostModel(0.0004, 0.004, 0.02, kappa=1e-7)
    few = [Measurement(i, o, 100 / model.cost(i, o)) for i, o in GRID[: LONG_TERMS_MIN_SHAPES - 1]]
    result = fit(few)
    assert (result.rho, result.kappa) == (0.0, 0.0) and result.intervals["kappa"] == (0.0, 0.0)
