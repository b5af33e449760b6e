"""A sweep step timed by the engine's own e2e histogram: read as vLLM and the simulated engine
write it, refused where it cannot stand for the step, and unbent by a stalled machine over real
sockets."""

import asyncio
import os
import signal
import threading
import time

import pytest

from capacity.benchmark.config import SweepConfig
from capacity.benchmark.drivers import connect
from capacity.benchmark.engine_timing import Histogram, step_latencies
from dataplane.runtime import metrics
from engine_model import perf_model
from engine_model.profiles import get_profile
from tests.runtime.support import http, sim_engine

TINY = get_profile("tiny-test")
E2E = "vllm:e2e_request_latency_seconds"


def exposition(*engines: metrics.Histogram) -> str:
    """/metrics text with one e2e histogram per engine, as the sim's writer renders it."""
    lines = []
    for index, histogram in enumerate(engines):
        lines += histogram.render(E2E, f'model_name="m",engine="{index}"')
    return "\n".join(lines) + "\n"


def observed(
    values: list[float], buckets: tuple[float, ...] = metrics.BENCHMARK_LATENCY_BUCKETS
) -> metrics.Histogram:
    histogram = metrics.Histogram(buckets)
    for value in values:
        histogram.observe(value)
    return histogram


def test_a_step_s_latencies_come_back_within_their_bucket_s_width():
    before_values = [0.4, 7.0]
    step_values = [1.02, 1.03, 2.5, 5.6, 5.61, 12.0]
    before = Histogram.parse(exposition(observed(before_values)))
    after = Histogram.parse(exposition(observed(before_values + step_values)))
    latencies = step_latencies(before, after, completed=len(step_values))
    assert latencies is not None and len(latencies) == len(step_values)
    for got, true in zip(latencies, sorted(step_values), strict=True):
        assert got == pytest.approx(true, rel=0.05)
    step = after.minus(before)
    assert step is not None and step.total_s == pytest.approx(sum(step_values))


def test_the_engines_of_a_data_parallel_server_are_summed():
    text = exposition(observed([1.0, 2.0]), observed([3.0]))
    histogram = Histogram.parse(text)
    assert histogram is not None and histogram.count == 3 and histogram.total_s == pytest.approx(6.0)


def test_vllm_s_default_buckets_are_too_wide_for_a_p99():
    # 5.1 s and 9.9 s fall in one bucket (5, 10]: the client's clock must time such a step.
    before = Histogram.parse(exposition(observed([], metrics.REQUEST_LATENCY_BUCKETS)))
    after = Histogram.parse(exposition(observed([5.1, 9.9], metrics.REQUEST_LATENCY_BUCKETS)))
    assert step_latencies(before, after, completed=2) is None


def test_other_requests_counted_or_a_missing_histogram_leave_the_step_to_the_client():
    before = Histogram.parse(exposition(observed([1.0])))
    after = Histogram.parse(exposition(observed([1.0, 2.0, 3.0])))
    assert step_latencies(before, after, completed=1) is None  # someone else's request too
    assert Histogram.parse("vllm:num_requests_running 0\n") is None
    assert step_latencies(None, after, completed=2) is None
    restarted = Histogram.parse(exposition(observed([])))
    assert step_latencies(after, restarted, completed=0) is None  # counters fell: a restart


def stalled(pid: int, after_s: float, for_s: float) -> threading.Thread:
    """SIGSTOP the process `after_s` from now for `for_s`: a machine too busy to run it."""

    def stall() -> None:
        time.sleep(after_s)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(for_s)
        os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=stall)
    thread.start()
    return thread


@pytest.mark.stack
def test_the_sim_s_clock_counts_the_profile_not_a_stalled_process():
    # tiny-test at real time: 100 tokens in, 50 out alone: 20 ms TTFT + 49 x 11 ms = 559 ms.
    # Stopped for 0.5 s mid-request, the client waits ~1.06 s; the engine says 0.559.
    _, solo = perf_model.solo_latency_s(TINY, 100, 50)
    with sim_engine("--profile", "tiny-test", "--time-scale", "1") as sim:
        stall = stalled(sim.proc.pid, 0.15, 0.5)
        started = time.monotonic()
        status, _, _ = http(
            "POST", sim.url + "/v1/completions", {"prompt": list(range(100)), "max_tokens": 50}
        )
        waited = time.monotonic() - started
        stall.join()
        assert status == 200 and waited >= solo + 0.45
        histogram = Histogram.parse(http("GET", sim.url + "/metrics")[2].decode())
    assert histogram is not None and histogram.count == 1
    assert histogram.total_s == pytest.approx(solo, abs=0.012)  # at most one 11-ms step of slack


@pytest.mark.stack
def test_a_closed_step_is_timed_by_the_engine_through_a_stall():
    # Four in flight, 16 requests of 16 x 16 at time scale 20; the sim stopped for 0.4 s (8
    # simulated seconds) mid-step. The client's clock would read a p99 over 8 s against a
    # 6.6-s SLO; the engine's latencies are the model's, 4 x 16 tokens in lockstep. The step's
    # duration stays the client's: 16 requests took it at least the stall.
    with sim_engine("--profile", "tiny-test", "--time-scale", "20") as sim:

        async def step() -> tuple[list[float], float, int, int]:
            driver = await connect(sim.url, SweepConfig(time_scale=20))
            try:
                await driver.closed((16, 16), 4, 4)  # warm the connections
                stall = stalled(sim.proc.pid, 0.02, 0.4)
                latencies, elapsed = await driver.closed((16, 16), 4, 16)
                stall.join()
                return latencies, elapsed, driver.steps_engine_timed, driver.steps_client_timed
            finally:
                await driver.aclose()

        latencies, elapsed, by_engine, by_client = asyncio.run(step())
    assert (by_engine, by_client) == (2, 0)
    per_request = 1 / perf_model.steady_state_requests_per_s(TINY, 16, 16, 4) * 4  # s, each of 4
    assert len(latencies) == 16 and max(latencies) < 2 * per_request < 5.0
    assert elapsed >= 0.4 * 20


@pytest.mark.stack
def test_an_open_step_the_client_could_not_offer_does_not_stand():
    # 100,000 arrivals per simulated second at time scale 20 is 2 M/s of wall time: no client
    # sends that on schedule, so the engine's easy latencies are not those of that rate.
    with sim_engine("--profile", "tiny-test", "--time-scale", "20") as sim:

        async def step() -> tuple[int, bool, int]:
            driver = await connect(sim.url, SweepConfig(time_scale=20))
            try:
                _, sent, saturated, _ = await driver.open((16, 1), 100_000.0, 40, 10**9)
                return sent, saturated, driver.steps_engine_timed
            finally:
                await driver.aclose()

        sent, saturated, by_engine = asyncio.run(step())
    assert sent == 40 and by_engine == 1 and saturated
