"""/tokenize and /detokenize speak vLLM's shapes, and count exactly as usage.prompt_tokens does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.runtime.support import SimProcess, sim_engine

pytestmark = pytest.mark.stack  # a simulated engine as a subprocess

MODEL = "sim-tiny"
PROMPTS = ["Hello world!", "a", "x" * 2400, "naïve café, 東京 🎉", "  spaced\n\tout  "]
CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}],
    [{"role": "narrator", "content": "Once"}, {"role": "assistant", "content": "upon"}],
    [{"role": "user", "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "parts"}]}],
]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with sim_engine("--profile", "tiny-test", "--time-scale", "100") as engine:
        yield engine


def tokenize(sim: SimProcess, **body: Any) -> dict[str, Any]:
    response = httpx.post(sim.url + "/tokenize", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def detokenize(sim: SimProcess, tokens: list[int]) -> str:
    response = httpx.post(sim.url + "/detokenize", json={"model": MODEL, "tokens": tokens})
    assert response.status_code == 200, response.text
    assert list(response.json()) == ["prompt"]
    return response.json()["prompt"]


@pytest.mark.parametrize("prompt", PROMPTS[:2] + PROMPTS[3:])
def test_tokenize_counts_what_a_completion_reports(
    sim: SimProcess, client: openai.OpenAI, prompt: str
) -> None:
    tokens = tokenize(sim, model=MODEL, prompt=prompt)
    assert list(tokens) == ["count", "max_model_len", "tokens", "token_strs"]  # vLLM's TokenizeResponse
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 512
    assert tokens["token_strs"] is None
    done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert done.usage is not None and done.usage.prompt_tokens == tokens["count"]
    by_ids = client.completions.create(model=MODEL, prompt=tokens["tokens"], max_tokens=1, echo=True)
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == tokens["count"]
    assert by_ids.choices[0].text.startswith(prompt)  # the ids stand for the text


@pytest.mark.parametrize("messages", CHATS)
def test_tokenize_counts_what_a_chat_reports(
    sim: SimProcess, client: openai.OpenAI, messages: list[dict[str, Any]]
) -> None:
    tokens = tokenize(sim, model=MODEL, messages=messages)
    done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert done.usage is not None and done.usage.prompt_tokens == tokens["count"]


TOOL = {"type": "function", "function": {"name": "lookup", "description": "d" * 1200, "parameters": {}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}


def test_a_chat_counts_its_tools_names_and_tool_calls_as_a_chat_template_renders_them(
    sim: SimProcess, client: openai.OpenAI
) -> None:
    """A model's chat template renders the request's tools and each message's name and tool calls:
    the engine counts them, so they are not free (1,200 bytes of tool description: 300 tokens)."""
    plain = [{"role": "user", "content": "hi"}]
    named = [{"role": "user", "content": "hi", "name": "n" * 400}]
    called = [
        *plain,
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "found", "tool_call_id": "call_1"},
    ]
    count = {
        "plain": tokenize(sim, model=MODEL, messages=plain)["count"],
        "named": tokenize(sim, model=MODEL, messages=named)["count"],
        "tools": tokenize(sim, model=MODEL, messages=plain, tools=[TOOL])["count"],
    }
    assert count["named"] >= count["plain"] + 100  # 400 bytes of name: 100 tokens
    assert count["tools"] >= count["plain"] + 300
    for messages, extra in ((named, {}), (plain, {"tools": [TOOL]}), (called, {"tools": [TOOL]})):
        done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, **extra)
        assert done.usage is not None
        assert done.usage.prompt_tokens == tokenize(sim, model=MODEL, messages=messages, **extra)["count"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_detokenize_gives_back_the_text(sim: SimProcess, prompt: str) -> None:
    tokens = tokenize(sim, prompt=prompt)["tokens"]
    assert all(0 <= t < 2**32 for t in tokens)  # ids fit in 32 bits, as vLLM's tokenizer needs
    assert detokenize(sim, tokens) == prompt


def test_tokenize_has_no_context_limit_as_in_vllm(sim: SimProcess) -> None:
    # 2,400 bytes: 600 tokens, more than the 512 a completion may have.
    assert tokenize(sim, prompt="x" * 2400)["count"] == 600


def test_token_strings_spell_the_prompt_and_the_chat_template(sim: SimProcess) -> None:
    assert tokenize(sim, prompt="Hello world!", return_token_strs=True)["token_strs"] == [
        "Hell",
        "o wo",
        "rld!",
    ]
    chat = tokenize(sim, messages=CHATS[0], return_token_strs=True)
    assert chat["token_strs"] == ["<|im_start|>", "<|user|>", "\n", "hi t", "here", "<|im_end|>"]
    assert detokenize(sim, chat["tokens"]) == "<|im_start|><|user|>\nhi there<|im_end|>"


def test_generated_token_ids_detokenize_to_the_generated_text(sim: SimProcess, client: openai.OpenAI) -> None:
    done = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=12, seed=3, extra_body={"return_token_ids": True}
    )
    choice = done.choices[0]
    assert choice.model_extra is not None
    assert detokenize(sim, choice.model_extra["token_ids"]) == choice.text
    assert choice.model_extra["prompt_token_ids"] == tokenize(sim, prompt="Hello")["tokens"]
