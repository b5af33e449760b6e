"""The capacity benchmark against a real simulated engine over HTTP on 127.0.0.1."""

import asyncio

import pytest

from capacity.benchmark import BenchmarkError, Slo, SweepConfig, sweep, table
from dataplane.runtime import perf_model
from dataplane.runtime.profiles import get_profile
from tests.runtime.support import free_port, http, sim_engine

TINY = get_profile("tiny-test")  # 4 slots, 512-token context: saturates with a handful of requests


@pytest.fixture
def tiny_sim():
    with sim_engine("--profile", "tiny-test", "--time-scale", "20") as sim:
        yield sim


def test_sustained_rates_track_the_engine_s_capacity(tiny_sim):
    sim = tiny_sim
    shapes = ((16, 16), (64, 64), (16, 600))
    result = asyncio.run(sweep(sim.url, SweepConfig(shapes=shapes, time_scale=20, requests_per_step=40)))
    short, long_, too_long = result.shapes
    for measured in (short, long_):
        # The model's own answer: at 4 in flight, 16/16 completes ~1060 requests/min, 64/64 ~262.
        ceiling = (
            perf_model.steady_state_requests_per_s(TINY, measured.input_tokens, measured.output_tokens, 4)
            * 60
        )
        assert 0.5 * ceiling <= measured.sustainable_per_minute <= 1.05 * ceiling, (measured, ceiling)
        modes = [s.mode for s in measured.steps]
        assert modes[0] == "closed" and modes[-1] == "open" and measured.steps[-1].met_slo
    assert too_long.sustainable_per_minute == 0 and "max_model_len 512" in too_long.note
    assert "req/min" in table(result)


def test_an_engine_that_is_down_fails_cleanly():
    with pytest.raises(BenchmarkError, match="unreachable"):
        asyncio.run(sweep(f"http://127.0.0.1:{free_port()}", SweepConfig(shapes=((16, 16),))))


def test_an_engine_that_answers_errors_fails_naming_the_shape(tiny_sim):
    sim = tiny_sim
    assert http("POST", f"{sim.url}/_sim/fault", {"mode": "errors", "fraction": 1.0})[0] == 200
    with pytest.raises(BenchmarkError, match=r"shape \(16 in, 8 out\): engine answered 500"):
        asyncio.run(sweep(sim.url, SweepConfig(shapes=((16, 8),))))


def test_an_engine_that_hangs_mid_sweep_fails_naming_the_shape(tiny_sim):
    sim = tiny_sim
    assert http("POST", f"{sim.url}/_sim/fault", {"mode": "hang"})[0] == 200
    config = SweepConfig(shapes=((32, 8),), request_timeout_s=1.0)
    with pytest.raises(
        BenchmarkError, match=r"shape \(32 in, 8 out\): no answer within 1 s: the engine hangs"
    ):
        asyncio.run(sweep(sim.url, config))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"requests_per_step": 5}, "requests_per_step must be >= 20"),
        ({"time_scale": 0}, "time_scale must be > 0"),
        ({"shapes": ((0, 8),)}, r"shape \(0 in, 8 out\): token counts must be >= 1"),
    ],
)
def test_bad_sweep_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SweepConfig(**kwargs)


def test_a_bad_engine_url_is_refused():
    with pytest.raises(BenchmarkError, match="engine URL must be http://host:port"):
        asyncio.run(sweep("ftp://nowhere", SweepConfig(), Slo()))


def test_a_shape_slower_than_a_larger_one_is_measured_again():
    from capacity.benchmark import ShapeResult, implausible

    def shape(i, o, rate):
        return ShapeResult(i, o, rate, 0.1, ())

    results = [
        shape(256, 16, 1505.0),  # slower than 256 x 64: disturbed
        shape(256, 64, 2257.0),
        shape(16, 16, 17000.0),  # within 25 % of 64 x 16: noise, kept
        shape(64, 16, 17500.0),
        shape(512, 512, 0.0),  # not even one request met the SLO: nothing to compare
    ]
    assert implausible(results) == [0]
