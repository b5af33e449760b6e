"""The simulated engine's timing and metrics count the tokens actually generated: a stop string
ends a request early, and each of n choices is a sequence of its own, as in vLLM."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from engine_model import perf_model
from engine_model.profiles import TINY_TEST
from tests.runtime.support import SimProcess, http, metric_value, sim_engine

pytestmark = pytest.mark.stack  # a simulated engine as a subprocess

MODEL = "sim-tiny"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    # Scale 10: the ~2 s (simulated) this test's long request would take run in 0.2 s.
    with sim_engine("--profile", "tiny-test", "--time-scale", "10") as engine:
        yield engine


def success(sim: SimProcess, reason: str) -> float:
    """vllm:request_success_total for one finished_reason."""
    text = http("GET", sim.url + "/metrics")[2].decode()
    samples = [line for line in text.splitlines() if line.startswith("vllm:request_success_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in samples if f'finished_reason="{reason}"' in line)


def test_a_stop_string_ends_the_request_and_its_engine_time_early(
    sim: SimProcess, client: openai.OpenAI
) -> None:
    full = client.completions.create(model=MODEL, prompt="Hello", max_tokens=200, seed=6).choices[0].text
    stop = full[6:8]
    tokens_before = metric_value(sim.url, "vllm:generation_tokens_total")
    e2e_before = metric_value(sim.url, "vllm:e2e_request_latency_seconds_sum")
    stopped_before = success(sim, "stop")
    done = client.completions.create(model=MODEL, prompt="Hello", max_tokens=200, seed=6, stop=stop)
    assert done.usage is not None and done.choices[0].finish_reason == "stop"
    generated = done.usage.completion_tokens
    assert generated < 20  # the stop string is among the first characters
    assert metric_value(sim.url, "vllm:generation_tokens_total") - tokens_before == generated
    assert success(sim, "stop") - stopped_before == 1
    # Alone in the engine: 2 prompt tokens, then `generated` tokens: ~10-20 steps of 11 ms, not 200.
    _, expected_s = perf_model.solo_latency_s(TINY_TEST, 2, generated)
    e2e = metric_value(sim.url, "vllm:e2e_request_latency_seconds_sum") - e2e_before
    assert e2e == pytest.approx(expected_s, abs=0.05)
    assert e2e < perf_model.solo_latency_s(TINY_TEST, 2, 200)[1] / 5


def test_n_choices_run_as_n_sequences(sim: SimProcess, client: openai.OpenAI) -> None:
    prompt_before = metric_value(sim.url, "vllm:prompt_tokens_total")
    tokens_before = metric_value(sim.url, "vllm:generation_tokens_total")
    length_before = success(sim, "length")
    done = client.completions.create(model=MODEL, prompt="Hello world!", max_tokens=5, n=3)
    assert done.usage is not None and done.usage.prompt_tokens == 3  # usage counts the prompt once
    # The engine prefills each sequence's prompt (no prefix cache) and decodes each.
    assert metric_value(sim.url, "vllm:prompt_tokens_total") - prompt_before == 3 * 3
    assert metric_value(sim.url, "vllm:generation_tokens_total") - tokens_before == 15
    assert success(sim, "length") - length_before == 3


def test_the_simulated_profiles_are_listed_one_per_line():
    import subprocess
    import sys

    from engine_model.profiles import PROFILES

    out = subprocess.run(
        [sys.executable, "-m", "dataplane.runtime.sim", "--list-profiles"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.splitlines() == sorted(PROFILES) and "h100x4-llama-70b" in out


def test_the_simulated_text_keeps_its_spaces():
    from dataplane.runtime.sim_generation import SIM_WORDS

    # "says" then "simulated" read "sayssimulated": every word that starts one starts with a space.
    assert " sim" in SIM_WORDS and "sim" not in SIM_WORDS
