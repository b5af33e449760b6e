"""Price a request in model units (MU), before it runs (estimate) and after (exact).

    cost = alpha * input_tokens + beta * output_tokens + gamma        [MU]

Before the request runs the router knows neither token count, and tokenizing on the hot path
would cost more than proxying. It estimates input tokens from the UTF-8 bytes of everything the
chat template renders (``capacity.units``: 4 bytes a token; token-id prompts are counted exactly)
and output tokens as the most the engine may generate (``validation.Demand.output_tokens``:
prompts x n x the output budget the engine honours; admission errs on the safe side). The
estimate is for admission only: after the response every request is metered (``metered``) from
the engine's ``usage``, or from what was delivered when a stream ended early.

Worked numbers (alpha 0.002, beta 0.02, gamma 0.1): a 400-byte prompt -> 100 tokens,
max_tokens 256 -> 0.2 + 5.12 + 0.1 = 5.42 MU estimated; usage 90 in / 40 out -> 0.18 + 0.8 + 0.1
= 1.08 MU exact.
"""

from __future__ import annotations

import json
from typing import Any

# One price rule for the whole system: capacity.units (pure, no Django) defines it; CostModel is
# re-exported for the router's modules.
from capacity.units import CostModel, estimate_tokens, text_bytes
from dataplane.wire.content_parts import part_text

__all__ = ["CostModel", "content_bytes", "estimate_input_tokens", "metered", "price"]

# The roles a chat template has a token for: in a message's MESSAGE_TOKENS. Another role (vLLM
# takes custom ones) is spelled out in the prompt, and counted as text.
TEMPLATE_ROLES = frozenset({"system", "user", "assistant", "tool", "developer", "function"})
MESSAGE_TOKENS = 4  # a chat template's tokens around each message: its start, role, a newline, its end
# The request's own fields a chat template renders into the prompt (tool and function definitions,
# a RAG template's documents), as JSON.
RENDERED_FIELDS = ("tools", "functions", "documents")


def price(c: CostModel, input_tokens: int, output_tokens: int) -> float:
    """MU of one request; 0.002*100 + 0.02*256 + 0.1 = 5.42."""
    return c.cost(input_tokens, output_tokens)


def metered(
    c: CostModel,
    estimate: tuple[int, int],
    usage: tuple[int, int] | None,
    delivered_tokens: int,
    status: int,
    answered: bool = False,
    client_cut: bool = False,
    details: tuple[int, int] = (0, 0),
    image_tokens: int = 0,
    prompt_tokens: int | None = None,
    failed: bool = False,
) -> tuple[float, int, int]:
    """(MU, input tokens, output tokens) a finished request is metered at; ``estimate`` is the
    admission's (input tokens, the most output tokens the engine may generate).

    1. Exact from the engine's ``usage`` when it reported it (every answer and stream that ran to
       its end).
    2. Nothing for an answer that failed for the platform's reasons: a 5xx answer, a pod lost
       or silent before or during its answer, an error event in its stream, a router's own cut,
       a stall its client gave up on (``failed``). Nothing for
       a 4xx answer from the engine either: a 404 for a model name the platform changed is the
       platform's doing, and any other refuses the tenant's own request (a prompt past the
       context, a parameter out of range) while the engine reads it, before any GPU work, as
       the router refuses what it can for nothing. The admission estimate is handed back.
    3. A stream cut by its client after tokens were delivered: its input tokens and the output
       tokens passed on to the client; so is one whose pod was lost after its endpoint left the
       routing table (its tenant deleted it: the router leaves its status as it was).
    4. A whole 2xx answer (``answered``, not a stream) without usage: the estimate, the most it
       could have cost (never 0: a pod must not make an answer free by leaving usage out).
    5. Sent to a pod and cut by its client (``client_cut``) before any token was delivered, the
       pod working (no head yet, or a 2xx one): the estimate. The engine did the prefill and
       some decoding for it (vLLM aborts only when it notices), and the client walked away from
       what it was admitted for: a non-streamed request must not become free by a reset just
       before its answer.
    6. Else a 2xx/3xx head with nothing delivered: its input tokens (the prompt was read).

    A request's input tokens in 3 to 6 are the engine's count of its prompt when the stream said
    it before its usage (``prompt_tokens``: continuous usage stats, which the router asks for),
    else the estimate from the prompt's bytes: a prompt costs its real size, never a quarter of
    it, however its stream ends.

    Coefficients 0.002/0.02/0.1, estimate 100 in / 256 out: usage 90 in / 40 out -> 1.08 MU;
    cut after 20 tokens -> 0.7 MU (0.68 with the engine's count of 90 prompt tokens); a 200
    answer without usage, or a client's reset before the answer -> 5.42 MU; a 400, a 404, a
    500, a pod lost before its head or mid-stream -> 0.

    ``details``: (cached, image) prompt tokens of the usage (usage_details): cached ones at the
    cached-token factor, image ones at delta. ``image_tokens``: the router's count of the
    request's image tokens (in ``estimate``'s input tokens), which prices them when the usage
    does not say (alpha 0.002, delta 0.0001, factor 0.1: usage 1,300 in (1,024 cached, 256 of
    images) / 16 out -> 0.002 x (276 + 102.4) + 0.32 + 0.1 + 0.0256 = 1.2024 MU).
    """
    if usage is not None:
        cached, images = details
        return c.cost(usage[0], usage[1], cached, images or image_tokens), usage[0], usage[1]
    if failed or status >= 400 or (status == 0 and not client_cut):
        return 0.0, 0, 0
    tokens_in, most_out = estimate
    if prompt_tokens is not None:
        tokens_in = prompt_tokens
    if delivered_tokens > 0:
        return c.cost(tokens_in, delivered_tokens, 0, image_tokens), tokens_in, delivered_tokens
    if (answered or client_cut) and status < 300:  # status 0: cut before the head
        return c.cost(tokens_in, most_out, 0, image_tokens), tokens_in, most_out
    return c.cost(tokens_in, 0, 0, image_tokens), tokens_in, 0


def content_bytes(content: Any) -> int:
    """UTF-8 bytes of a message's text: a string, or the text vLLM reads from its content parts
    (strings, and `content_parts.part_text`: a text part's own field, a tool reference's name);
    anything else counts 0, as a ``text`` field on an image part does (vLLM ignores it)."""
    if isinstance(content, str):
        return text_bytes(content)
    total = 0
    if isinstance(content, list):  # chat content parts: [{"type": "text", "text": "..."}, ...]
        for part in content:
            text = part if isinstance(part, str) else part_text(part) if isinstance(part, dict) else None
            if text:
                total += text_bytes(text)
    return total


def _rendered_bytes(value: Any) -> int:
    """UTF-8 bytes of a field a chat template renders: a string's own, another value's as
    compact JSON (tool calls, tool definitions: templates render them with ``tojson``)."""
    if isinstance(value, str):
        return text_bytes(value)
    if value is None:
        return 0
    return text_bytes(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def _message_bytes(message: dict[str, Any]) -> int:
    """UTF-8 bytes of one chat message as a template renders it: its content's text, a role the
    template has no token for, and every other field (``name``, ``tool_calls`` with their
    arguments, ``tool_call_id``, ``reasoning_content``, ...)."""
    total = 0
    for key, value in message.items():
        if key == "content":
            total += content_bytes(value)
        elif key == "role":
            if isinstance(value, str) and value not in TEMPLATE_ROLES:
                total += text_bytes(value)
        else:
            total += _rendered_bytes(value)
    return total


def estimate_input_tokens(body: dict[str, Any], chat: bool | None = None) -> int:
    """Input tokens of a completions (``prompt``) or chat (``messages``) request body; ``chat``
    names the path (True: messages only, False: prompt only, None: prompt, else messages).

    A string prompt of 400 bytes -> 100 (100 emoji, 400 bytes -> 100 too); a token-id prompt
    [1, 2, 3] -> 3; a batch of prompts sums its members. Chat: the bytes of every message as the
    template renders it (``_message_bytes``) and of the request's tools, functions and documents,
    + MESSAGE_TOKENS a message. Shapes ``validation`` refuses count what they can.
    """
    prompt = None if chat else body.get("prompt")
    if prompt is not None or chat is False:
        if isinstance(prompt, str):
            return estimate_tokens(text_bytes(prompt))
        if isinstance(prompt, list):
            total = 0
            for item in prompt:
                if isinstance(item, str):
                    total += estimate_tokens(text_bytes(item))
                elif isinstance(item, list):
                    total += len(item)
                else:  # an int: a single token id of a token-id prompt
                    total += 1
            return total
        return 0
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0
    rendered = 0
    for m in messages:
        if isinstance(m, dict):
            rendered += _message_bytes(m)
    for field in RENDERED_FIELDS:
        if field in body:
            rendered += _rendered_bytes(body[field])
    return estimate_tokens(rendered) + MESSAGE_TOKENS * len(messages)
