"""Over real HTTP, the simulated engine's latency follows its profile and honours priority."""

from __future__ import annotations

import json
import threading
import time

import pytest

from dataplane.runtime import sim
from dataplane.runtime.metrics import sample_sum
from tests.runtime.support import (
    CompletionRace,
    SimProcess,
    http,
    metric_value,
    sim_engine,
    wait_until,
)

pytestmark = pytest.mark.stack  # simulated engines as subprocesses


def timed_completion(sim: SimProcess, body: dict[str, object]) -> float:
    start = time.monotonic()
    status, _, _ = http("POST", sim.url + "/v1/completions", body, timeout=30)
    assert status == 200
    return time.monotonic() - start


def test_latency_follows_the_profile_alone_and_in_a_batch() -> None:
    # tiny-test at real time (scale 1): 100 prompt tokens (token ids), 50 output tokens.
    # Alone: TTFT 10 + 100 x 0.1 = 20 ms; 49 decode steps x (10 + 1) ms = 539 ms -> 559 ms.
    # Four at once (lockstep): prefill 10 + 400 x 0.1 = 50 ms; 49 x (10 + 4) = 686 ms
    # -> 736 ms each: 4x the throughput for 1.32x the latency.
    with sim_engine("--profile", "tiny-test", "--time-scale", "1") as sim:
        body = {"prompt": list(range(100)), "max_tokens": 50}
        solo = timed_completion(sim, body)
        assert 0.559 <= solo < 0.559 + 0.15
        metrics = http("GET", sim.url + "/metrics")[2].decode()
        assert sample_sum(metrics, "vllm:e2e_request_latency_seconds_sum") == pytest.approx(0.559, abs=0.03)

        results: list[float] = []
        gate = threading.Barrier(4)

        def client() -> None:
            gate.wait()
            results.append(timed_completion(sim, body))

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        assert len(results) == 4
        # Arrivals spread over a step or two, so allow one extra step (~15 ms) of skew.
        for latency in results:
            assert 0.736 - 0.02 <= latency < 0.736 + 0.2


def test_top_priority_request_takes_the_first_free_slot() -> None:
    # tiny-test has 4 slots. Four long requests (100, 150, 200, 250 tokens) fill them and
    # finish one at a time; then three low-priority requests queue, then one at priority -100.
    # The high one takes the slot the 100-token request frees (about 100 steps x 14 ms =
    # 1.4 s simulated, 0.7 s real at 2x: ample time to queue the others first) and finishes
    # long before the low ones, which wait for the later slots.
    with sim_engine("--profile", "tiny-test", "--time-scale", "2") as sim:
        race = CompletionRace(sim.url, timeout=30)

        def send(name: str, max_tokens: int, priority: int) -> None:
            race.send(name, {"prompt": "go", "max_tokens": max_tokens, "priority": priority})

        for i in range(4):
            send(f"long{i}", 100 + 50 * i, 0)
        wait_until(lambda: metric_value(sim.url, "vllm:num_requests_running") == 4, timeout=5)
        for i in range(3):
            send(f"low{i}", 5, 10)
        wait_until(lambda: metric_value(sim.url, "vllm:num_requests_waiting") == 3, timeout=5)
        send("high", 5, -100)
        wait_until(lambda: metric_value(sim.url, "vllm:num_requests_waiting") == 4, timeout=5)
        finished = race.join()
        assert finished.index("high") < min(finished.index(f"low{i}") for i in range(3))
        assert finished[:2] == ["long0", "high"]


def test_streaming_tokens_arrive_step_by_step() -> None:
    # At 10x, each decode step of a lone tiny-test request is 11 ms simulated = 1.1 ms real;
    # 40 tokens arrive over ~45 ms, not all at once at the end.
    with sim_engine("--profile", "tiny-test", "--time-scale", "10") as sim:
        _, _, raw = http(
            "POST", sim.url + "/v1/completions", {"prompt": "go", "max_tokens": 40, "stream": True}
        )
        chunks = [c for c in raw.decode().split("\n\n") if c.startswith("data: {")]
        assert len(chunks) == 40
        assert json.loads(chunks[-1][6:])["choices"][0]["finish_reason"] == "length"


def test_the_engine_takes_vllm_s_long_prefill_threshold_and_refuses_one_past_the_context(capsys) -> None:
    # A pod's spec passes vLLM's flags after `--` to either engine; the sim's steps are the perf
    # model's, which tests/runtime/test_scheduler_matches_vllm.py checks against vLLM's scheduler.
    args = sim.parse_args(["--port", "0", "--profile", "tiny-test", "--long-prefill-token-threshold", "64"])
    assert sim.engine_profile(args).long_prefill_token_threshold == 64
    assert sim.engine_profile(sim.parse_args(["--port", "0"])).long_prefill_token_threshold == 0
    with pytest.raises(SystemExit) as exit_:
        sim.parse_args(["--port", "0", "--profile", "tiny-test", "--long-prefill-token-threshold", "513"])
    assert exit_.value.code == 2
    assert "long_prefill_token_threshold must be in 0..max_model_len 512, got 513" in capsys.readouterr().err
