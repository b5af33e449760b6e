"""Pricing in MU with worked numbers (alpha 0.002, beta 0.02, gamma 0.1), and the input estimate:
the UTF-8 bytes of everything a chat template renders, 4 a token."""

import json

import pytest

from capacity.units import estimate_tokens, text_bytes
from dataplane.router.pricing import CostModel, estimate_input_tokens, price

C = CostModel(alpha=0.002, beta=0.02, gamma=0.1)
EMOJI = "\U0001f600"  # 4 UTF-8 bytes: one token of the simulated engine, 1 to 4 of a BPE vocabulary


def test_price_of_estimate_and_exact_usage():
    assert price(C, 100, 256) == pytest.approx(5.42)  # 0.2 + 5.12 + 0.1
    assert price(C, 90, 40) == pytest.approx(1.08)  # 0.18 + 0.8 + 0.1


def test_bytes_to_tokens_rounds_up():
    assert estimate_tokens(400) == 100
    assert estimate_tokens(401) == 101
    assert estimate_tokens(1) == 1
    assert estimate_tokens(0) == 0


def test_text_is_counted_in_utf8_bytes():
    assert [text_bytes(t) for t in ("hello", "h\u00e9llo", EMOJI, "\u4e2d", "\ud800")] == [5, 6, 4, 3, 3]
    assert estimate_input_tokens({"prompt": EMOJI * 2000}) == 2000  # 8,000 bytes, not 2,000 characters
    assert estimate_input_tokens({"prompt": "\u00e9" * 400}) == 200
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": EMOJI * 100}]}]}
    assert estimate_input_tokens(chat, chat=True) == 100 + 4


def test_input_tokens_of_completion_prompts():
    assert estimate_input_tokens({"prompt": "x" * 400}) == 100
    assert estimate_input_tokens({"prompt": [1, 2, 3]}) == 3  # token ids counted exactly
    assert estimate_input_tokens({"prompt": ["x" * 8, "y" * 4]}) == 3  # a batch sums its members
    assert estimate_input_tokens({"prompt": [[1, 2], [3]]}) == 3


def test_input_tokens_of_chat_messages():
    body = {
        "messages": [
            {"role": "system", "content": "x" * 40},
            {"role": "user", "content": [{"type": "text", "text": "y" * 40}]},
        ]
    }
    assert estimate_input_tokens(body) == 20 + 2 * 4  # 80 bytes -> 20 tokens, +4 per message


def test_every_field_the_chat_template_renders_is_counted():
    """Names, tool calls and their arguments, tool results, reasoning, a custom role, and the
    request's tool definitions: the template renders each into the prompt."""
    calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "d" * 400,
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
    messages = [
        {"role": "user", "content": "hi", "name": "n" * 40},
        {"role": "assistant", "content": None, "tool_calls": calls, "reasoning_content": "r" * 40},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        {"role": "narrator" * 5, "content": ""},  # a role the template has no token for: spelled out
    ]
    rendered = (
        2 + 40  # content, name
        + len(json.dumps(calls, separators=(",", ":"))) + 40  # tool calls as JSON, reasoning
        + 5 + 6  # content, tool_call_id
        + 40  # the custom role
        + len(json.dumps(tools, separators=(",", ":")))
    )  # fmt: skip
    body = {"messages": messages, "tools": tools}
    assert estimate_input_tokens(body, chat=True) == estimate_tokens(rendered) + 4 * 4
    assert (
        estimate_input_tokens(body, chat=True)
        > estimate_input_tokens({"messages": messages}, chat=True) + 100
    )
    # tool call arguments as an object (vLLM takes both) count as their JSON, non-ASCII in bytes
    as_object = [
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"q": EMOJI * 50}}}]}
    ]
    assert estimate_input_tokens({"messages": as_object}, chat=True) >= 50 + 4


def test_input_tokens_read_the_path_s_field_only():
    body = {"prompt": "x", "messages": [{"role": "user", "content": "y" * 400}]}
    assert estimate_input_tokens(body, chat=True) == 100 + 4  # a stray prompt is not priced
    assert estimate_input_tokens(body, chat=False) == 1  # nor stray messages on completions
    # string parts and refusal parts are text too; a malformed part counts 0 (validation refuses it)
    parts = [{"role": "user", "content": ["x" * 8, {"type": "refusal", "refusal": "y" * 4}, {"text": 5}]}]
    assert estimate_input_tokens({"messages": parts}, chat=True) == 3 + 4
    # a tool reference's name is joined into the prompt; an image part's stray text is not read
    image = {"type": "image_url", "image_url": {"url": "data:,"}, "text": "z" * 400}
    parts = [{"role": "user", "content": [{"type": "tool_reference", "name": "w" * 8}, image]}]
    assert estimate_input_tokens({"messages": parts}, chat=True) == 2 + 4
