"""Fitting alpha/beta/gamma from measured rates, with worked numbers."""

import math
import random

import pytest

from capacity.fitting import Measurement, fit

TRUE = (0.0004, 0.004, 0.02)  # MU per input token, per output token, per request


def rate(i, o, coef=TRUE, mu=100.0):
    return mu / (coef[0] * i + coef[1] * o + coef[2])


GRID = [(i, o) for i in (16, 64, 256, 1024, 2048) for o in (1, 8, 64, 512)]


def test_exact_measurements_recover_the_coefficients():
    result = fit([Measurement(i, o, rate(i, o)) for i, o in GRID])
    assert (result.alpha, result.beta, result.gamma) == pytest.approx(TRUE, rel=1e-9)
    assert result.r2 == pytest.approx(1.0) and result.heldout_mape < 1e-9 and result.samples == 20
    assert all(abs(r) < 1e-9 for r in result.residuals)


def test_the_worked_example_in_the_docstring():
    # (100 in, 10 out) at 1000/min -> 0.1 MU; (100, 100) at 250/min -> 0.4 MU: beta = 0.3 / 90.
    shapes = [
        (100, 10, 1000),
        (100, 100, 250),
        (100, 190, 142.857142857),
        (100, 55, 400),
        (100, 145, 181.818181818),
    ]
    result = fit([Measurement(i, o, r) for i, o, r in shapes])
    assert result.beta == pytest.approx(0.3 / 90, rel=1e-6)


def test_noisy_measurements_fit_within_their_noise():
    rng = random.Random(1)
    noisy = [Measurement(i, o, rate(i, o) * (1 + rng.uniform(-0.03, 0.03))) for i, o in GRID]
    result = fit(noisy)
    assert result.alpha == pytest.approx(TRUE[0], rel=0.1)
    assert result.beta == pytest.approx(TRUE[1], rel=0.05)
    assert result.heldout_mape < 0.05 and result.r2 > 0.99
    for name, value in [("alpha", result.alpha), ("beta", result.beta), ("gamma", result.gamma)]:
        low, high = result.intervals[name]
        assert low <= value <= high
    assert result.intervals["beta"][0] <= TRUE[1] <= result.intervals["beta"][1]


def test_coefficients_never_go_negative():
    # Costs that fall with input length would need alpha < 0: NNLS pins alpha at 0 instead.
    shapes = [Measurement(i, 10, 100 / (0.2 - 0.00005 * i)) for i in (16, 100, 400, 1000, 2000)]
    result = fit(shapes)
    assert result.alpha == 0 and result.beta >= 0 and result.gamma >= -result.beta
    assert result.intervals["alpha"] == (0.0, 0.0)
    assert result.predict(16, 1) >= 0  # a one-token answer never costs less than nothing


def test_a_line_on_the_decoded_tokens_is_recovered_with_its_negative_intercept():
    # The engine emits the first token with the prefill: cost = 0.0002 in + 0.006 (out - 1) +
    # 0.004 = 0.0002 in + 0.006 out - 0.002. gamma >= 0 would tilt the line (beta too low, the
    # short answers over-priced, the long ones under-priced); gamma >= -beta holds it exactly.
    def decoded(i: int, o: int) -> float:
        return 100 / (0.0002 * i + 0.006 * (o - 1) + 0.004)

    result = fit([Measurement(i, o, decoded(i, o)) for i, o in GRID])
    assert (result.alpha, result.beta, result.gamma) == pytest.approx((0.0002, 0.006, -0.002), rel=1e-9)
    assert result.heldout_mape < 1e-9 and result.worst_underprice[0] > -1e-9
    low, high = result.intervals["gamma"]
    assert low <= -0.002 <= high
    assert result.predict(16, 1) == pytest.approx(0.0002 * 16 + 0.004)


def test_a_poor_fit_is_refused_with_the_reason():
    # A cost that grows with the square of the output cannot be priced linearly.
    shapes = [Measurement(64, o, 100 / (0.01 + 1e-5 * o * o)) for o in (1, 16, 64, 128, 256, 512)]
    result = fit(shapes)
    publish, why = result.verdict(0.10)
    assert not publish and "held-out MAPE" in why and "exceeds the 10.0% threshold" in why
    ok, _ = fit([Measurement(i, o, rate(i, o)) for i, o in GRID]).verdict(0.10)
    assert ok


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            Measurement(64, 8, math.nan),
            r"shape \(64 in, 8 out\): requests_per_minute must be finite and > 0, got nan",
        ),
        (Measurement(64, 8, -3.0), "got -3.0"),
        (Measurement(64, 8, math.inf), "got inf"),
        (Measurement(-1, 8, 10.0), r"shape \(-1 in, 8 out\): token counts must be >= 0"),
    ],
)
def test_non_finite_or_negative_measurements_never_reach_the_fit(bad, message):
    with pytest.raises(ValueError, match=message):
        fit([*(Measurement(i, o, rate(i, o)) for i, o in GRID), bad])


def test_too_few_shapes_is_a_clear_error():
    with pytest.raises(ValueError, match="need at least 5 distinct shapes"):
        fit([Measurement(i, 8, rate(i, 8)) for i in (16, 64, 256)])
