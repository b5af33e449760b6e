"""The simulated engine speaks the vLLM OpenAI subset and says plainly that it is simulated."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from dataplane.runtime.metrics import progress_total, sample_sum
from tests.runtime.support import SimProcess, http, sim_engine

pytestmark = pytest.mark.stack  # a simulated engine as a subprocess


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with sim_engine("--profile", "tiny-test", "--time-scale", "100") as engine:
        yield engine


def test_completion_returns_text_and_usage(sim: SimProcess) -> None:
    # "Hello world!" is 12 bytes -> ceil(12 / 4) = 3 prompt tokens.
    status, headers, raw = http(
        "POST", sim.url + "/v1/completions", {"model": "sim-tiny", "prompt": "Hello world!", "max_tokens": 5}
    )
    body = json.loads(raw)
    assert (status, headers["x-engine"]) == (200, "simulated")
    assert body["object"] == "text_completion" and body["model"] == "sim-tiny"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["text"]
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (3, 5, 8)


def test_chat_completion_returns_a_message(sim: SimProcess) -> None:
    # One message: 4 template tokens + ceil(8 / 4) = 2 -> 6 prompt tokens.
    status, _, raw = http(
        "POST",
        sim.url + "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi there"}], "max_completion_tokens": 4},
    )
    body = json.loads(raw)
    assert status == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (6, 4, 10)


@pytest.mark.parametrize("chat", [False, True])
def test_streaming_sends_sse_chunks_then_done(sim: SimProcess, chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    payload: dict[str, object] = {"max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    payload.update({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})
    status, headers, raw = http("POST", sim.url + path, payload)
    assert status == 200 and headers["content-type"] == "text/event-stream; charset=utf-8"
    assert headers["x-engine"] == "simulated"
    events = raw.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    if chat:  # vLLM opens a chat stream with the role and empty content
        opening = chunks.pop(0)
        assert opening["object"] == "chat.completion.chunk"
        assert opening["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(chunks) == 4  # 3 tokens + usage
    assert [c["choices"][0]["finish_reason"] for c in chunks[:3]] == [None, None, "length"]
    assert chunks[3]["choices"] == [] and chunks[3]["usage"]["completion_tokens"] == 3


def test_models_card_says_simulated(sim: SimProcess) -> None:
    status, headers, raw = http("GET", sim.url + "/v1/models")
    card = json.loads(raw)["data"][0]
    assert status == 200 and headers["x-engine"] == "simulated"
    assert card["id"] == "sim-tiny" and card["simulated"] is True
    assert card["max_model_len"] == 512 and card["sim_profile"] == "tiny-test"
    assert http("GET", sim.url + "/health")[0] == 200


def test_metrics_use_vllm_names(sim: SimProcess) -> None:
    before = progress_total(http("GET", sim.url + "/metrics")[2].decode())
    http("POST", sim.url + "/v1/completions", {"prompt": list(range(10)), "max_tokens": 7})
    text = http("GET", sim.url + "/metrics")[2].decode()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_sum",
    ):
        assert sample_sum(text, name) is not None, name
    # One more finished request and 7 more tokens.
    assert progress_total(text) == (before or 0) + 1 + 7
    assert 'finished_reason="length"' in text
