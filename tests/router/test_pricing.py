"""Pricing in MU with worked numbers (alpha 0.002, beta 0.02, gamma 0.1)."""

import pytest

from dataplane.router.pricing import (
    Coefficients,
    chars_to_tokens,
    estimate_input_tokens,
    price,
)

C = Coefficients(alpha=0.002, beta=0.02, gamma=0.1)


def test_price_of_estimate_and_exact_usage():
    assert price(C, 100, 256) == pytest.approx(5.42)  # 0.2 + 5.12 + 0.1
    assert price(C, 90, 40) == pytest.approx(1.08)  # 0.18 + 0.8 + 0.1


def test_chars_to_tokens_rounds_up():
    assert chars_to_tokens(400) == 100
    assert chars_to_tokens(401) == 101
    assert chars_to_tokens(1) == 1
    assert chars_to_tokens(0) == 0


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
    assert estimate_input_tokens(body) == 20 + 2 * 4  # 80 chars -> 20 tokens, +4 per message


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
