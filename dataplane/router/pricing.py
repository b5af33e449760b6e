"""Price a request in model units (MU), before it runs (estimate) and after (exact).

    cost = alpha * input_tokens + beta * output_tokens + gamma        [MU]

Before the request runs the router knows neither token count, and tokenizing on the hot path
would cost more than proxying. It estimates input tokens as prompt characters / 4 (the usual
English rule of thumb for BPE tokenizers; token-id prompts are counted exactly) and output tokens
as the most the engine may generate (``validation.Demand.output_tokens``: prompts x n x the output
budget the engine honours; admission errs on the safe side). The estimate is for admission
only: after the response every request is metered (``metered``) from the engine's ``usage``, or
from what was delivered when a stream ended early.

Worked numbers (alpha 0.002, beta 0.02, gamma 0.1): a 400-character prompt -> 100 tokens,
max_tokens 256 -> 0.2 + 5.12 + 0.1 = 5.42 MU estimated; usage 90 in / 40 out -> 0.18 + 0.8 + 0.1
= 1.08 MU exact.
"""

from __future__ import annotations

from typing import Any

# One price rule for the whole system: capacity.units (pure, no Django) defines it.
from capacity.units import BYTES_PER_TOKEN as CHARS_PER_TOKEN
from capacity.units import CostModel as Coefficients
from capacity.units import estimate_tokens as chars_to_tokens
from dataplane.wire.content_parts import part_text

__all__ = ["CHARS_PER_TOKEN", "Coefficients", "chars_to_tokens", "estimate_input_tokens", "metered", "price"]


def price(c: Coefficients, input_tokens: int, output_tokens: int) -> float:
    """MU of one request; 0.002*100 + 0.02*256 + 0.1 = 5.42."""
    return c.cost(input_tokens, output_tokens)


def metered(
    c: Coefficients,
    estimate: tuple[int, int],
    usage: tuple[int, int] | None,
    delivered_tokens: int,
    status: int,
    answered: bool = False,
    client_cut: bool = False,
    details: tuple[int, int] = (0, 0),
    image_tokens: int = 0,
) -> tuple[float, int, int]:
    """(MU, input tokens, output tokens) a finished request is metered at; ``estimate`` is the
    admission's (input tokens, the most output tokens the engine may generate).

    1. Exact from the engine's ``usage`` when it reported it (every answer and stream that ran to
       its end).
    2. A stream cut early (client gone, pod lost, timeout) after tokens were delivered: the
       estimated input tokens and the output tokens passed on to the client.
    3. A whole 2xx answer (``answered``, not a stream) without usage: the estimate, the most it
       could have cost (never 0: a pod must not make an answer free by leaving usage out).
    4. Sent to a pod and cut by its client (``client_cut``) before any token was delivered, the
       pod working (no head yet, or a 2xx one): the estimate. The engine did the prefill and
       some decoding for it (vLLM aborts only when it notices), and the client walked away from
       what it was admitted for: a non-streamed request must not become free by a reset just
       before its answer.
    5. A 4xx answer from the pod (it refused the request: the client's doing, found after the
       engine read the prompt): the smallest answer it could have had, its estimated input
       tokens and one output token (vLLM generates at least one). Never free, or a request the
       pod refuses would spend no reservation, whatever its estimate on admission was.
    6. Else a 2xx/3xx head with nothing delivered: the estimated input tokens (the prompt was
       read); a 5xx answer or none (a pod failure before the head: the client got a 502/504)
       is not the client's doing and costs nothing.

    Coefficients 0.002/0.02/0.1, estimate 100 in / 256 out: usage 90 in / 40 out -> 1.08 MU;
    cut after 20 tokens -> 0.7 MU; a 200 answer without usage, or a client's reset before the
    answer -> 5.42 MU; a 400 -> 0.2 + 0.02 + 0.1 = 0.32 MU (100 in / 1 out; with gamma at its
    floor -beta, 0.2 MU: one output token is never under 0); a 500 -> 0; a pod lost before its
    head -> 0.

    ``details``: (cached, image) prompt tokens of the usage (usage_details): cached ones at the
    cached-token factor, image ones at delta. ``image_tokens``: the router's count of the
    request's image tokens (in ``estimate``'s input tokens), which prices them when the usage
    does not say (alpha 0.002, delta 0.0001, factor 0.1: usage 1,300 in (1,024 cached, 256 of
    images) / 16 out -> 0.002 x (276 + 102.4) + 0.32 + 0.1 + 0.0256 = 1.2024 MU).
    """
    if usage is not None:
        cached, images = details
        return c.cost(usage[0], usage[1], cached, images or image_tokens), usage[0], usage[1]
    tokens_in, most_out = estimate
    if delivered_tokens > 0:
        return c.cost(tokens_in, delivered_tokens, 0, image_tokens), tokens_in, delivered_tokens
    if (answered or client_cut) and (200 <= status < 300 or (client_cut and status == 0)):
        return c.cost(tokens_in, most_out, 0, image_tokens), tokens_in, most_out
    if 400 <= status < 500:
        return c.cost(tokens_in, 1, 0, image_tokens), tokens_in, 1
    if 0 < status < 400:
        return c.cost(tokens_in, 0, 0, image_tokens), tokens_in, 0
    return 0.0, 0, 0


def _content_chars(content: Any) -> int:
    """Characters of a message's text: a string, or the text vLLM reads from its content parts
    (strings, and `content_parts.part_text`: a text part's own field, a tool reference's name);
    anything else counts 0, as a ``text`` field on an image part does (vLLM ignores it)."""
    if isinstance(content, str):
        return len(content)
    total = 0
    if isinstance(content, list):  # chat content parts: [{"type": "text", "text": "..."}, ...]
        for part in content:
            text = part if isinstance(part, str) else part_text(part) if isinstance(part, dict) else None
            total += len(text or "")
    return total


def estimate_input_tokens(body: dict[str, Any], chat: bool | None = None) -> int:
    """Input tokens of a completions (``prompt``) or chat (``messages``) request body; ``chat``
    names the path (True: messages only, False: prompt only, None: prompt, else messages).

    A string prompt of 400 chars -> 100; a token-id prompt [1, 2, 3] -> 3; a batch of prompts
    sums its members; chat sums the text of every message (+4 tokens per message for the role
    and separators the chat template adds). Shapes ``validation`` refuses count what they can.
    """
    prompt = None if chat else body.get("prompt")
    if prompt is not None or chat is False:
        if isinstance(prompt, str):
            return chars_to_tokens(len(prompt))
        if isinstance(prompt, list):
            total = 0
            for item in prompt:
                if isinstance(item, str):
                    total += chars_to_tokens(len(item))
                elif isinstance(item, list):
                    total += len(item)
                else:  # an int: a single token id of a token-id prompt
                    total += 1
            return total
        return 0
    messages = body.get("messages")
    if isinstance(messages, list):
        chars = 0
        for m in messages:
            if isinstance(m, dict):
                chars += _content_chars(m.get("content"))
        return chars_to_tokens(chars) + 4 * len(messages)
    return 0
