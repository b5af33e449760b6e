"""Pricing in MU with worked numbers (alpha 0.002, beta 0.02, gamma 0.1)."""

import pytest

from dataplane.router.pricing import (
    Coefficients,
    chars_to_tokens,
    estimate_input_tokens,
    price,
    requested_output_tokens,
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


def test_output_tokens_default_max_tokens_and_n():
    assert requested_output_tokens({}, 256) == 256
    assert requested_output_tokens({"max_tokens": 50}, 256) == 50
    assert requested_output_tokens({"max_completion_tokens": 30, "max_tokens": 50}, 256) == 30
    assert requested_output_tokens({"max_tokens": 50, "n": 3}, 256) == 150
    assert requested_output_tokens({"max_tokens": "lots"}, 256) == 256
