"""Pricing a request in model units, with worked numbers."""

import pytest

from capacity.units import CostModel, estimate_tokens

SMALL = CostModel(alpha=0.0004, beta=0.004, gamma=0.02)


def test_a_chat_turn_costs_alpha_in_beta_out_plus_gamma():
    assert SMALL.cost(50, 50) == pytest.approx(0.24)
    assert SMALL.cost(2000, 10) == pytest.approx(0.86)
    assert SMALL.requests_per_minute(50, 50, 100) == pytest.approx(416.67, rel=1e-4)


def test_prefix_cache_hits_cost_a_tenth_of_alpha():
    # 2,000 prompt tokens, 1,500 cached: 500 x 0.0004 + 1,500 x 0.00004 + 10 x 0.004 + 0.02 = 0.32
    assert SMALL.cost(2000, 10, cached_tokens=1500) == pytest.approx(0.32)
    assert SMALL.cost(10, 0, cached_tokens=50) == pytest.approx(SMALL.cost(10, 0, cached_tokens=10))


def test_the_estimate_prices_output_at_max_tokens():
    # 400 bytes ~ 100 tokens: 100 x 0.0004 + 256 x 0.004 + 0.02 = 1.084
    assert SMALL.estimate(prompt_bytes=400, max_tokens=256) == pytest.approx(1.084)
    assert [estimate_tokens(b) for b in (0, 1, 4, 5, 401)] == [0, 1, 1, 2, 101]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": -1, "beta": 0, "gamma": 0}, "alpha must be a finite number >= 0, got -1"),
        ({"alpha": 0, "beta": float("nan"), "gamma": 0}, "beta must be a finite number >= 0, got nan"),
        (
            {"alpha": 0, "beta": 0, "gamma": float("inf")},
            r"gamma must be a finite number >= -beta \(0\), got inf",
        ),
        (
            {"alpha": 0, "beta": 0.5, "gamma": -0.6},
            r"gamma must be a finite number >= -beta \(-0.5\), got -0.6",
        ),
        ({"alpha": 0, "beta": 0, "gamma": 0, "cached_token_factor": 2}, "cached_token_factor must be in"),
    ],
)
def test_bad_coefficients_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CostModel(**kwargs)


def test_a_negative_gamma_never_prices_a_request_below_zero():
    # A fitted line on the decoded tokens: gamma = gamma_d - beta = 0.004 - 0.006.
    model = CostModel(alpha=0.0002, beta=0.006, gamma=-0.002)
    assert model.cost(16, 1) == pytest.approx(0.0002 * 16 + 0.004)
    assert model.cost(0, 0) == 0.0 and model.cost(5, 0) == 0.0  # not -0.002 nor -0.001


def test_the_fit_the_router_and_the_simulator_price_with_the_one_rule():
    from capacity.fitting import Fit
    from capacity.simulate.sizing import cost_model_for
    from capacity.units import price
    from dataplane.router.pricing import CostModel
    from engine_model.profiles import get_profile

    fitted = Fit(0.0004, 0.004, 0.02, {}, 1.0, 0.0, (), 5)
    router = CostModel(0.0004, 0.004, 0.02)
    assert fitted.predict(50, 50) == router.cost(50, 50) == price(0.0004, 0.004, 0.02, 50, 50) == 0.24
    simulated = cost_model_for(get_profile("tiny-test"), batch=8)
    assert simulated.cost(100, 10) == price(simulated.alpha, simulated.beta, 0.0, 100, 10)
