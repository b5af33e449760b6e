"""The capacity benchmark against a real simulated engine over HTTP on 127.0.0.1."""

import asyncio
from dataclasses import replace

import pytest

from capacity.benchmark.config import DEFAULT_SHAPES, Slo, SweepConfig, grid_for_context, on_virtual_clock
from capacity.benchmark.drivers import SimulatedDriver
from capacity.benchmark.report import table
from capacity.benchmark.results import BenchmarkError
from capacity.benchmark.sweep import sweep
from engine_model import perf_model
from engine_model.profiles import get_profile
from tests.runtime.support import free_port, http, sim_engine

TINY = get_profile("tiny-test")  # 4 slots, 512-token context: saturates with a handful of requests


@pytest.fixture
def tiny_sim():
    with sim_engine("--profile", "tiny-test", "--time-scale", "20", "--enable-fault-injection") as sim:
        yield sim


@pytest.mark.stack
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
        assert modes[0] == "closed" and modes[-1] == "open"
        met = [s.offered_per_s for s in measured.steps if s.mode == "open" and s.met_slo]
        assert measured.sustainable_per_minute == pytest.approx(max(met) * 60)
    assert too_long.sustainable_per_minute == 0 and "max_model_len 512" in too_long.note
    assert "req/min" in table(result)


def test_an_engine_that_is_down_fails_cleanly():
    with pytest.raises(BenchmarkError, match="unreachable"):
        asyncio.run(sweep(f"http://127.0.0.1:{free_port()}", SweepConfig(shapes=((16, 16),))))


@pytest.mark.stack
def test_an_engine_that_answers_errors_fails_naming_the_shape(tiny_sim):
    sim = tiny_sim
    assert http("POST", f"{sim.url}/_sim/fault", {"mode": "errors", "fraction": 1.0})[0] == 200
    with pytest.raises(BenchmarkError, match=r"shape \(16 in, 8 out\): engine answered 500"):
        asyncio.run(sweep(sim.url, SweepConfig(shapes=((16, 8),))))


@pytest.mark.stack
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
        ({"remeasure_share": -0.1}, "remeasure_share must be >= 0"),
        ({"max_wall_s": 0}, "max_wall_s must be > 0"),
        ({"concurrency_bisections": -1}, "concurrency_bisections must be >= 0"),
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
    from capacity.benchmark.checks import implausible
    from capacity.benchmark.results import ShapeResult

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


def test_a_shape_is_priced_at_least_at_the_rate_of_a_larger_one():
    from capacity.benchmark.checks import at_least_larger
    from capacity.benchmark.results import ShapeResult

    def shape(i, o, rate, note=""):
        return ShapeResult(i, o, rate, 0.1, (), note)

    raised = at_least_larger(
        [
            shape(128, 16, 1633.0, "re-measured"),  # stalled twice: 256 x 16 did 9,048
            shape(256, 16, 9048.0),
            shape(128, 64, 5243.0),  # smaller than 256 x 16 in output only: not comparable
            shape(16, 16, 17000.0),  # 64 x 16 did 17,500: within noise, raised all the same
            shape(64, 16, 17500.0),
            shape(16, 1, 0.0, "longer than max_model_len 8"),  # skipped: stays skipped
        ]
    )
    assert [r.sustainable_per_minute for r in raised] == [9048.0, 9048.0, 5243.0, 17500.0, 17500.0, 0.0]
    assert raised[0].note == "re-measured raised from 1633: 256x16 sustained more"
    assert raised[1].note == raised[2].note == "" and raised[5].note == "longer than max_model_len 8"


class ScriptedEngine:
    """A Driver whose answers are set by the test: closed-loop throughput per concurrency for
    short steps (a list: one per step at that concurrency, in turn), `long_step` req/s for a
    step longer than C x 4 requests, and open-loop steps that meet the SLO up to `open_limit`
    req/s."""

    name, model, max_model_len = "scripted", "m", 4096
    last_step_engine_timed = False  # timed as by a client's clock

    def __init__(self, short_steps, long_step=10.0, open_limit=8.6):
        self.short_steps = short_steps  # concurrency -> req/s of a short closed step
        self.open_limit = open_limit
        self.long_step = long_step
        self.offered = []

    async def closed(self, shape, concurrency, total):
        if total == 2:  # the warm-up pair
            return [0.1, 0.1], 0.2
        long = total > concurrency * 4 and total > 16
        rate = self.long_step if long else self.short_steps[concurrency]
        if isinstance(rate, list):  # successive steps (long ones, or at this concurrency)
            rate = rate.pop(0)
        return [0.5] * total, total / rate

    async def open(self, shape, rate, count, in_flight_bound):
        self.offered.append(rate)
        latency = 0.5 if rate <= self.open_limit else 60.0  # past it the queue outgrows the SLO
        return [latency] * count, count, False, count / rate


ONE_LOOK = SweepConfig(shapes=((64, 64),), remeasure_share=0)  # the first measurement only


def closed_steps(shape):
    return [(s.concurrency, s.sent) for s in shape.steps if s.mode == "closed"]


def test_a_long_step_at_the_knee_rescues_a_disturbed_climb_and_the_open_loop_bisects():
    # Climb: C=1 5 req/s, C=2 6, C=4 6.2, C=8 6.1: two doublings without 5 % more end it at the
    # knee C=4, 6.2 req/s (every short step was slowed). One 3-s step there (ceil(6.2 x 3) = 19
    # requests) measures the engine's 10 req/s, over 1.25 x 6.2: the climb was stalled and goes
    # on from C=8: 6.1 and 6.0 at C=16 (each under 0.7 x 10, so each measured twice), no higher
    # knee. The open loop starts from 10. Poisson at 9.5 and 9.0 miss, 8.0 meets, then halfway
    # back, 8.5, meets too -> 8.5 req/s = 510 req/min.
    engine = ScriptedEngine({1: 5.0, 2: 6.0, 4: 6.2, 8: 6.1, 16: 6.0})
    (shape,) = asyncio.run(sweep(engine, ONE_LOOK, Slo())).shapes
    assert closed_steps(shape) == [
        (1, 16), (2, 16), (4, 16), (8, 32), (4, 19), (8, 32), (8, 32), (16, 64), (16, 64)
    ]  # fmt: skip
    assert engine.offered == pytest.approx([9.5, 9.0, 8.0, 8.5])
    assert shape.sustainable_per_minute == pytest.approx(510.0)


def test_a_stall_in_the_long_step_does_not_lower_the_knee():
    # Climb: 5, 9, 12 at C=4, then 10 and 10 -> knee C=4 at 12 req/s. The 3-s step there (36
    # requests) is stalled at 3 req/s and does not count: a stall only takes away. The open
    # loop brings 12 down to what meets the SLO: 11.4, 10.8 and 9.6 miss, 0.7 x 12 = 8.4 meets,
    # halfway back 9.0 misses -> 8.4 req/s = 504 req/min.
    engine = ScriptedEngine({1: 5.0, 2: 9.0, 4: 12.0, 8: 10.0, 16: 10.0}, long_step=3.0)
    (shape,) = asyncio.run(sweep(engine, ONE_LOOK, Slo())).shapes
    assert closed_steps(shape) == [(1, 16), (2, 16), (4, 16), (8, 32), (16, 64), (4, 36)]
    assert engine.offered == pytest.approx([11.4, 10.8, 9.6, 8.4, 9.0])
    assert shape.sustainable_per_minute == pytest.approx(504.0)


def test_a_climb_stalled_from_the_start_goes_on_after_the_long_step():
    # Real vLLM, 256 x 16, served one request at a time for a few seconds: C=1 25.5 req/s, C=2
    # 26.7, C=4 26.9 -> flat twice, knee C=4. The 3-s step there (81 requests) does 63.6, over
    # 1.25 x 26.9: the climb goes on, C=8 110, C=16 150, C=32 152, C=64 150 -> knee C=32 at 152,
    # measured at length again (456 requests, 160). Without it the shape was priced from 63.6.
    engine = ScriptedEngine(
        {1: 25.5, 2: 26.7, 4: 26.9, 8: 110.0, 16: 150.0, 32: 152.0, 64: 150.0}, long_step=[63.6, 160.0]
    )
    (shape,) = asyncio.run(sweep(engine, SweepConfig(shapes=((256, 16),)), Slo())).shapes
    assert closed_steps(shape)[3:] == [(4, 81), (8, 32), (16, 64), (32, 128), (64, 256), (32, 456)]
    assert engine.offered[0] == pytest.approx(0.95 * 160.0)


def test_a_collapsed_climb_step_is_measured_again_before_it_can_end_the_climb():
    # C=1 3 req/s, C=2 5, C=4 7, then C=8 stalls at 2 (under 0.7 x 7 = 4.9) and is measured
    # again: 9. C=16 stalls at 2.5 (under 0.7 x 9), again: 9.2; C=32 9.3: two doublings without
    # 5 % more -> knee C=32 at 9.3. The open loop: 0.95 x 9.3 = 8.84 misses, 0.9 x 9.3 = 8.37
    # meets (0.05 apart: nothing to bisect) -> 8.37 req/s = 502 req/min. Without the repeats,
    # the two stalls would have ended the climb at C=4, 7 req/s (the long step there is slow
    # too), and priced the shape at 399.
    engine = ScriptedEngine({1: 3.0, 2: 5.0, 4: 7.0, 8: [2.0, 9.0], 16: [2.5, 9.2], 32: 9.3}, long_step=7.0)
    (shape,) = asyncio.run(sweep(engine, ONE_LOOK, Slo())).shapes
    assert closed_steps(shape) == [(1, 16), (2, 16), (4, 16), (8, 32), (8, 32), (16, 64), (16, 64), (32, 128)]
    assert engine.offered == pytest.approx([0.95 * 9.3, 0.9 * 9.3])
    assert shape.sustainable_per_minute == pytest.approx(0.9 * 9.3 * 60)


def test_a_shape_the_others_price_far_cheaper_is_measured_again():
    from capacity.benchmark.checks import slow_outliers
    from capacity.benchmark.results import ShapeResult

    clean, stalled = slowed_sweep(0)[0], slowed_sweep(1, factor=2.5)[0]
    by_shape = {s.shape: s for s in stalled.shapes}
    again = by_shape[(128, 128)]
    assert again.note == "re-measured"  # read ~2.5x slow, then measured again
    assert again.sustainable_per_minute == pytest.approx(clean.shapes[4].sustainable_per_minute)
    assert stalled.fit().heldout_mape == pytest.approx(clean.fit().heldout_mape)
    # Costs exactly linear (0.01 in + 0.1 out + 1, per 60,000): nothing is suspect. 128 x 128
    # read 2x slow: suspect; 15 % slow is within the slack. 30 % fast: only the slow side is
    # suspect (it shifts the others' errors by at most 16 %).
    results = [ShapeResult(i, o, 60_000 / (1 + i / 100 + o / 10), 0.1, ()) for i, o in SEVEN]
    assert slow_outliers(results) == []

    def with_128x128(factor):
        return slow_outliers([*results[:4], replace(results[4], sustainable_per_minute=
                              results[4].sustainable_per_minute * factor), *results[5:]])  # fmt: skip

    assert (with_128x128(0.5), with_128x128(1 / 1.15), with_128x128(1.3)) == ([4], [], [])


class Clocked:
    """A driver whose every step advances a fake wall clock by the step's duration, so how many
    second looks fit in the sweep's time is decided by the steps alone."""

    def __init__(self, inner):
        self.inner, self.now = inner, 0.0
        self.name, self.model, self.max_model_len = inner.name, inner.model, inner.max_model_len
        self.last_step_engine_timed = False

    def clock(self):
        return self.now

    async def closed(self, shape, concurrency, total):
        latencies, elapsed = await self.inner.closed(shape, concurrency, total)
        self.now += elapsed
        return latencies, elapsed

    async def open(self, shape, rate, count, in_flight_bound):
        latencies, sent, saturated, elapsed = await self.inner.open(shape, rate, count, in_flight_bound)
        self.now += elapsed
        return latencies, sent, saturated, elapsed


class SlowForVisits:
    """The in-process simulated H100, except that `shape` runs `factor` x slow during its first
    `visits` visits (a visit: the sweep's steps at the shape until it moves to another)."""

    def __init__(self, shape, factor, visits):
        from capacity.benchmark.drivers import SimulatedDriver

        self.inner = SimulatedDriver(get_profile("h100-llama-8b"))
        self.name, self.model, self.max_model_len = "slowed", self.inner.model, self.inner.max_model_len
        self.last_step_engine_timed = False
        self.shape, self.factor, self.visits, self.seen, self.last = shape, factor, visits, 0, None

    def slow(self, shape):
        if shape == self.shape and self.last != shape:
            self.seen += 1
        self.last = shape
        return self.factor if shape == self.shape and self.seen <= self.visits else 1.0

    async def closed(self, shape, concurrency, total):
        k = self.slow(shape)
        latencies, elapsed = await self.inner.closed(shape, concurrency, total)
        return [t * k for t in latencies], elapsed * k

    async def open(self, shape, rate, count, in_flight_bound):
        k = self.slow(shape)
        latencies, sent, saturated, elapsed = await self.inner.open(shape, rate, count, in_flight_bound)
        return [t * k for t in latencies], sent, saturated, elapsed * k


SEVEN = ((16, 16), (128, 16), (512, 16), (16, 128), (128, 128), (512, 128), (50, 50))


def slowed_sweep(visits, factor=1.15, **settings):
    """A sweep of SEVEN on a fake clock, 128 x 128 `factor` x slow for its first `visits`
    visits: (the result, how many visits 128 x 128 had)."""
    engine = Clocked(SlowForVisits((128, 128), factor, visits))
    result = asyncio.run(sweep(engine, SweepConfig(shapes=SEVEN, **settings), Slo(), clock=engine.clock))
    return result, engine.inner.seen


def test_every_shape_gets_a_second_look_and_the_faster_stands():
    # 128 x 128 reads 15 % slow through its whole first measurement: within slow_outliers' 20 %
    # slack, so only the second look (its climb, long step and open loop, after the other
    # shapes) brings it back to the clean rate; without the time for it, the slow rate stands.
    clean = slowed_sweep(0)[0].shapes[4]
    again = slowed_sweep(1)[0].shapes[4]
    assert again.note == "second look"
    assert again.sustainable_per_minute == pytest.approx(clean.sustainable_per_minute, rel=0.02)
    first = [s for s in again.steps if s.mode == "open"]
    assert len(first) > len([s for s in clean.steps if s.mode == "open"])  # both looks recorded
    slow = slowed_sweep(1, remeasure_share=0)[0].shapes[4]
    assert slow.note == "" and slow.sustainable_per_minute < 0.9 * clean.sustainable_per_minute


def test_second_looks_go_round_after_round_while_the_time_lasts():
    # 128 x 128 reads 15 % slow through its first measurement and its first second look (the
    # first of the first round: slowest against the others' fit); the second round looks at it
    # first again and finds the clean rate. With max_wall_s at the first pass's end, no second
    # look starts and the slow rate stands.
    clean = slowed_sweep(0, remeasure_share=0)[0].shapes[4]
    looked, visits = slowed_sweep(2, remeasure_share=3.0)
    assert visits >= 3 and looked.shapes[4].note == "second look"
    assert looked.shapes[4].sustainable_per_minute == pytest.approx(clean.sustainable_per_minute, rel=0.02)
    first_pass = slowed_sweep(2, remeasure_share=0)[0]
    capped, visits = slowed_sweep(2, remeasure_share=3.0, max_wall_s=first_pass.wall_s + 1e-6)
    assert visits == 1 and capped.shapes[4].sustainable_per_minute < 0.9 * clean.sustainable_per_minute


def test_a_second_look_climbs_again_from_the_knee():
    # Real vLLM, 128 x 64: a disturbance ended the climb at C=4. First look: C=1 5 req/s, C=2 9,
    # C=4 12, then 10 and 10 at C=8 and 16 (two doublings without 5 % more) -> knee C=4; the
    # 3-s step there (36 requests) also reads 12; Poisson at 0.95 x 12 = 11.4 meets -> 684
    # req/min, in 27.9 s. The second look (share 0.6 of 27.9 s: one look of about half a shape)
    # climbs again from C=4: 12, then 20 at C=8, 24 at C=16, 24.5 at C=32 and 24 at C=64 ->
    # knee C=32, its long step (ceil(24.5 x 3) = 74 requests) 24.5; 0.95 x 24.5 = 23.275 meets
    # -> 1,396.5 req/min. Measuring the knee C=4 again, however long, could not find it.
    engine = Clocked(
        ScriptedEngine(
            {1: 5.0, 2: 9.0, 4: 12.0, 8: [10.0, 20.0], 16: [10.0, 24.0], 32: 24.5, 64: 24.0},
            long_step=12.0,
            open_limit=30.0,
        )
    )
    config = SweepConfig(shapes=((128, 64),), remeasure_share=0.6)
    (shape,) = asyncio.run(sweep(engine, config, Slo(), clock=engine.clock)).shapes
    assert closed_steps(shape) == [
        (1, 16), (2, 16), (4, 16), (8, 32), (16, 64), (4, 36),  # the first look
        (4, 16), (8, 32), (16, 64), (32, 128), (64, 256), (32, 74),  # the second
    ]  # fmt: skip
    assert engine.inner.offered == pytest.approx([11.4, 23.275])
    assert shape.note == "second look" and shape.sustainable_per_minute == pytest.approx(1396.5)


def test_bisecting_the_knee_finds_the_batch_between_two_doublings():
    # Simulated L40S, 128 x 16: C=64 meets the 6.6-s SLO and C=128 misses it, so the doubling
    # climb reads the shape at C=64; the bisection finds the largest C in between that meets it.
    profile, shape, slo = get_profile("l40s-llama-8b"), (128, 16), Slo()
    rates, knees = [], []
    for bisections in (0, 4):
        driver = SimulatedDriver(profile)
        config = replace(
            on_virtual_clock(SweepConfig(shapes=(shape,), remeasure_share=0)),
            concurrency_bisections=bisections,
        )
        (result,) = asyncio.run(sweep(driver, config, slo, clock=lambda d=driver: d.elapsed_s)).shapes
        closed = [s for s in result.steps if s.mode == "closed" and s.met_slo]
        knees.append(max(closed, key=lambda s: s.throughput_per_s).concurrency)
        missed = [s.concurrency for s in result.steps if s.mode == "closed" and not s.met_slo]
        assert all(knees[-1] < c for c in missed)  # the knee is below every C that missed
        rates.append(result.sustainable_per_minute)
    assert knees[0] & (knees[0] - 1) == 0  # a power of two
    assert knees[0] < knees[1] < 2 * knees[0]
    # The exact steady state of the knee's batch (one prefill step + 15 decode steps a request).
    truth = 60 * perf_model.steady_state_requests_per_s(profile, *shape, knees[1])
    assert rates[1] > rates[0] * 1.03
    assert rates[1] == pytest.approx(truth, rel=0.03)


def test_a_short_context_gets_the_grid_within_it():
    assert grid_for_context(8192) == DEFAULT_SHAPES  # the default grid fits: 2,048 + 512
    grid = grid_for_context(512)  # tiny-test: the default grid would keep 6 shapes of 17
    assert len(grid) == 17 and max(i + o for i, o in grid) <= 512
    assert {i for i, _ in grid} == {16, 40, 50, 102, 256} and {o for _, o in grid} == {1, 16, 45, 50, 128}
    assert len(set(grid_for_context(64))) == len(grid_for_context(64))  # no shape twice
    driver = SimulatedDriver(TINY)
    config = replace(on_virtual_clock(SweepConfig()), remeasure_share=0)
    result = asyncio.run(sweep(driver, config, clock=lambda: driver.elapsed_s))
    assert [s.shape for s in result.shapes] == list(grid)
    assert all(s.sustainable_per_minute > 0 for s in result.shapes)
