"""The benchmark's images and prefix cache (capacity.benchmark.extras): the one-coefficient fit
worked by hand, the vision profile's delta (per image token: it fits, per image it does not),
the prefix-cache discount read from the engine's cached-token figures, and the command's
contract for the vision profile (published, held-out <= 5 %, delta > 0)."""

from __future__ import annotations

import asyncio
import json
from io import StringIO

import pytest
from django.core.management import call_command

from capacity.benchmark import extras
from capacity.benchmark.extras import ImageShape, VisionDriver, fit_linear_term, prefix_shapes
from capacity.units import CostModel
from controlplane.capacity.models import ModelProfile, ProfileFit
from engine_model.profiles import get_profile

VL = get_profile("h100-qwen2-vl-7b-vision")


def test_the_one_term_fit_worked_by_hand():
    # 0.30 and 0.50 MU measured, text prices 0.20 and 0.30, 1,000 and 2,000 image tokens:
    # theta = (0.1 x 1000 / 0.09 + 0.2 x 2000 / 0.25) / (1000^2 / 0.09 + 2000^2 / 0.25) = 0.0001
    theta, interval, heldout = fit_linear_term([0.30, 0.50], [0.20, 0.30], [1000, 2000], 0.0, 1.0)
    assert theta == pytest.approx(0.0001) and heldout == pytest.approx(0.0, abs=1e-9)
    assert interval == (pytest.approx(0.0001), pytest.approx(0.0001))  # no residual: no width
    # a noisy third shape widens the interval and shows in the held-out error
    theta, (low, high), heldout = fit_linear_term(
        [0.30, 0.50, 0.44], [0.20, 0.30, 0.25], [1000, 2000, 1500], 0, 1
    )
    assert low < theta < high and heldout > 0.01
    assert fit_linear_term([1.0], [2.0], [1.0], 0.0, 1.0)[0] == 0.0  # bounded below: never negative


def test_prefix_shapes_fit_the_context():
    assert [(s.input_tokens, s.output_tokens, s.shared) for s in prefix_shapes(8192)] == [
        (512, 16, 448), (512, 128, 256), (2048, 16, 1792), (2048, 128, 1024), (2048, 1, 1920),
    ]  # fmt: skip
    assert max(s.input_tokens + s.output_tokens for s in prefix_shapes(512)) <= 512


def test_the_driver_counts_image_tokens_and_reads_cached_tokens_from_its_prefix_cache():
    driver = VisionDriver(VL, images=((448, 448), (1024, 768)), shared_prefix=100)
    first, second = driver._request((128, 8)), driver._request((128, 8))
    assert first.prompt_tokens == 128 + 256 + 999 and first.encoder_s == pytest.approx(0.000018 * (256 + 999))
    assert (first.cached_tokens, second.cached_tokens) == (0, 96)  # 6 whole blocks of the 100 shared
    assert (driver.requests, driver.cached_tokens) == (2, 96)
    assert "2 image(s), shared prefix 100" in driver.name and "simulated" in driver.name
    with pytest.raises(ValueError, match="no vision encoder"):
        VisionDriver(get_profile("tiny-test"), images=((448, 448),))


@pytest.fixture(scope="module")
def text_price() -> CostModel:
    from capacity.benchmark.config import SweepConfig, on_virtual_clock
    from capacity.benchmark.drivers import SimulatedDriver
    from capacity.benchmark.sweep import sweep

    driver = SimulatedDriver(VL)
    result = asyncio.run(sweep(driver, on_virtual_clock(SweepConfig()), clock=lambda: driver.elapsed_s))
    f = result.fit()
    return CostModel(f.alpha, f.beta, f.gamma, rho=f.rho, kappa=f.kappa)


def test_delta_per_image_token_fits_where_per_image_does_not(text_price):
    images = asyncio.run(extras.measure_images(VL, text_price))
    assert images.value > 0 and images.interval[0] <= images.value <= images.interval[1]
    assert images.heldout_mape <= 0.05 and images.samples == len(extras.IMAGE_SHAPES)
    # the same measurements priced per image: the 1,024 x 768 screenshots are under-priced
    costs = [float(r["cost_mu"]) for r in images.rows]
    base = [text_price.cost(int(r["prompt_tokens"]), int(r["output_tokens"])) for r in images.rows]
    _, _, per_image_heldout = fit_linear_term(
        costs, base, [float(r["images"]) for r in images.rows], 0.0, 1.0
    )
    assert per_image_heldout > 0.05 > images.heldout_mape


def test_a_slow_processor_costs_an_image_more(text_price):
    from engine_model.vision import with_preprocessing

    shapes = (ImageShape(16, 1, 4, 448, 448),)  # little text: the images' preprocessing shows
    fast = asyncio.run(extras.measure_images(VL, text_price, shapes=shapes)).rows[0]
    slow = asyncio.run(
        extras.measure_images(with_preprocessing(VL, "slow", None), text_price, shapes=shapes)
    ).rows[0]
    assert float(slow["cost_mu"]) > 1.3 * float(fast["cost_mu"])  # the CPU bounds it: the GPU waits


def test_the_prefix_discount_is_measured_from_the_cached_tokens(text_price):
    prefix = asyncio.run(extras.measure_prefix_cache(VL, text_price))
    # the simulated engine skips cached tokens' prefill entirely: they cost (nearly) nothing
    assert prefix.value < 0.05 and prefix.heldout_mape <= 0.05
    # whole blocks of the shared prefix, every request but the first (a miss) in the mean
    assert all(0 <= r["shared"] // 16 * 16 - r["cached_tokens"] <= 1 for r in prefix.rows)


def test_the_command_publishes_the_vision_profile_with_delta(h100):
    out = StringIO()
    args = (
        "--model",
        "Qwen/Qwen2-VL-7B-Instruct",
        "--gpu",
        "h100-80gb",
        "--simulated",
        "h100-qwen2-vl-7b-vision",
    )
    call_command("benchmark", *args, "--create-model", "--json", stdout=out)
    summary = json.loads(out.getvalue().strip().splitlines()[-1])
    assert summary["published"] and summary["heldout_mape"] <= 0.05 and summary["delta"] > 0
    assert summary["delta_heldout_mape"] <= 0.05 and summary["cached_token_factor"] is not None
    profile = ModelProfile.objects.get(model="Qwen/Qwen2-VL-7B-Instruct")
    record = profile.fits.get()
    assert record.status == ProfileFit.Status.PUBLISHED
    assert profile.delta == record.delta == summary["delta"]
    assert profile.cached_token_factor == record.cached_token_factor
    assert len(record.extras["delta"]["shapes"]) == len(extras.IMAGE_SHAPES)
