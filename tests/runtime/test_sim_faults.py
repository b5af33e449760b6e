"""Injected faults behave like the real failures they stand for."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from dataplane.runtime.metrics import sample_sum
from dataplane.runtime.sim import CRASH_EXIT_CODE
from tests.runtime.support import free_port, http, sim_engine, wait_until

pytestmark = pytest.mark.stack  # simulated engines as subprocesses


def test_hang_stops_progress_while_health_stays_200() -> None:
    with sim_engine("--enable-fault-injection", "--profile", "tiny-test", "--time-scale", "100") as sim:
        assert http("POST", sim.url + "/_sim/fault", {"mode": "hang"})[0] == 200
        result: list[int] = []
        thread = threading.Thread(
            target=lambda: result.append(
                http("POST", sim.url + "/v1/completions", {"prompt": "x", "max_tokens": 2}, timeout=10)[0]
            )
        )
        thread.start()
        thread.join(timeout=0.5)
        assert thread.is_alive() and not result  # the request is stuck
        assert http("GET", sim.url + "/health")[0] == 200  # as a hung vLLM: health is fine
        text = http("GET", sim.url + "/metrics")[2].decode()
        assert sample_sum(text, "vllm:request_success_total") == 0
        assert http("POST", sim.url + "/_sim/fault", {"mode": "none"})[0] == 200
        thread.join(timeout=5)
        assert result == [200]  # released when the fault clears


def test_errors_fail_the_given_fraction_with_500() -> None:
    # Seeded: of 40 requests at fraction 0.5, some but not all fail, each with vLLM's body.
    with sim_engine(
        "--enable-fault-injection", "--profile", "tiny-test", "--time-scale", "100", "--seed", "1"
    ) as sim:
        http("POST", sim.url + "/_sim/fault", {"mode": "errors", "fraction": 0.5})
        statuses = []
        for _ in range(40):
            status, _, raw = http("POST", sim.url + "/v1/completions", {"prompt": "x", "max_tokens": 1})
            statuses.append(status)
            if status == 500:
                assert json.loads(raw)["error"]["type"] == "InternalServerError"
        assert 8 <= statuses.count(500) <= 32 and statuses.count(200) >= 8


def test_slow_multiplies_step_time() -> None:
    # tiny-test, 20 tokens alone: 10 + 0.1 + 19 x 11 = 219.1 ms simulated; at factor 3 the
    # engine reports 3x that in its e2e histogram (simulated seconds).
    with sim_engine("--enable-fault-injection", "--profile", "tiny-test", "--time-scale", "10") as sim:
        http("POST", sim.url + "/_sim/fault", {"mode": "slow", "factor": 3})
        http("POST", sim.url + "/v1/completions", {"prompt": "x", "max_tokens": 20})
        text = http("GET", sim.url + "/metrics")[2].decode()
        e2e = sample_sum(text, "vllm:e2e_request_latency_seconds_sum") or 0
        assert 3 * 0.2191 - 0.02 <= e2e <= 3 * 0.2191 + 0.1


def test_crash_exits_non_zero() -> None:
    with sim_engine("--enable-fault-injection", "--profile", "tiny-test") as sim:
        assert http("POST", sim.url + "/_sim/fault", {"mode": "crash"})[0] == 200
        assert sim.proc.wait(timeout=5) == CRASH_EXIT_CODE


def test_fault_by_flag_after_a_delay() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dataplane.runtime.sim",
            "--port",
            str(port),
            "--fault",
            "crash",
            "--fault-after",
            "0.3",
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.wait(timeout=10) == CRASH_EXIT_CODE
    finally:
        proc.kill()
        proc.wait()
    with sim_engine("--enable-fault-injection", "--fault", "hang") as sim:
        wait_until(lambda: json.loads(http("GET", sim.url + "/_sim/fault")[2])["mode"] == "hang", timeout=2)
