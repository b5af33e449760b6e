"""The parameters a request is priced from, read as the engine will read them. Pure: no I/O.

``demand`` reads ``max_tokens`` / ``max_completion_tokens``, ``n``, ``prompt`` and ``messages`` as
vLLM 0.32 does (pydantic's lax mode: 12, 12.0, "12" and true are integers; 12.5, "x" and 1e400 are
not) and refuses, with a 400 naming the parameter, what would poison the price; ``check_context``
refuses a prompt past the context in vLLM's own words, only where the engine surely refuses it.
The rule for any change: the router never refuses what vLLM accepts (the simulated engine,
``dataplane.runtime.openai_api``, is the executable copy of vLLM's rules to check against). Every
parameter's rule: docs/router.md, "What a request is priced and admitted at" and "Reading a
request as vLLM does".
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from capacity.units import estimate_tokens, text_bytes
from dataplane.router.http import RequestError
from dataplane.router.images import NO_IMAGES, ImageCount, count_images
from dataplane.router.pricing import content_bytes
from dataplane.wire.content_parts import CHAT_PART_TYPES, NON_MEDIA_PART_TYPES, part_kind, text_field


class InvalidParameter(RequestError):
    """A 400 in OpenAI's error format whose ``param`` names the parameter at fault."""

    def __init__(self, param: str, message: str, code: str = "invalid_value") -> None:
        super().__init__(400, message, code, param=param)


class Demand(NamedTuple):  # a tuple: built per request, cheaper than a frozen dataclass
    """What a request asks the engine to generate: ``prompts`` x ``n`` sequences, each up to
    ``max_tokens`` output tokens."""

    prompts: int  # prompts in the request (a batch counts each), >= 1
    n: int  # sequences per prompt, >= 1
    max_tokens: int  # output tokens per sequence at most, >= 0
    images: ImageCount = NO_IMAGES  # the chat's images: count, prompt tokens, bytes

    @property
    def sequences(self) -> int:
        return self.prompts * self.n

    @property
    def output_tokens(self) -> int:
        """The most output tokens the engine may generate: 3 prompts x n 2 x 100 -> 600."""
        return self.prompts * self.n * self.max_tokens


_new_tuple = tuple.__new__  # Demand(...) without its Python-level __new__ (a frame a request)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def lax_int(value: Any) -> int | None:
    """The integer pydantic reads from a JSON value in lax mode, as vLLM does, or None: 12, 12.0,
    "12", " 12 " and true are integers; 12.5, inf (JSON 1e400), "x", null and [] are not."""
    if isinstance(value, int):  # bool is an int: pydantic's lax mode reads true as 1
        return int(value)
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
        return int(number) if math.isfinite(number) and number.is_integer() else None
    return None


_BOOL_STRINGS = {
    **dict.fromkeys(("1", "true", "t", "yes", "y", "on"), True),
    **dict.fromkeys(("0", "false", "f", "no", "n", "off"), False),
}


def lax_bool(value: Any) -> bool | None:
    """The boolean pydantic reads from a JSON value in lax mode, as vLLM does (``stream``,
    ``stream_options.include_usage``), or None (the engine refuses it): true, 1, 1.0, "true",
    "1", "yes", "on", "t", "y" (any case, spaces stripped) are True; their opposites False."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        return _BOOL_STRINGS.get(value.strip().lower())
    return None


def _int_param(body: dict[str, Any], name: str) -> int | None:
    """``body[name]`` as an integer; None when absent or null; a 400 when not an integer."""
    value = body.get(name)
    if value is None or type(value) is int:  # absent, or the common case: no conversion
        return value
    number = lax_int(value)
    if number is None:
        raise InvalidParameter(name, f"{name} must be an integer, got {_shown(value)}", "invalid_type")
    return number


def _out_of_range(name: str, value: int, low: int, high: int, why: str) -> InvalidParameter:
    """The 400 of an integer ``value`` outside [low, high]."""
    if value < low:
        return InvalidParameter(
            name, f"{name} must be at least {low}, got {_shown(value)}", "integer_below_min_value"
        )
    return InvalidParameter(
        name, f"{name}={_shown(value)} cannot be greater than {high} ({why})", "integer_above_max_value"
    )


def prompt_count(prompt: Any) -> int:
    """Prompts in a completions ``prompt``: a string or a token-id list is one, a list of
    strings or of token-id lists one per member; 400 for another shape."""
    if isinstance(prompt, str):
        return 1
    if not isinstance(prompt, list):
        raise InvalidParameter(
            "prompt",
            f"prompt must be a string, a list of strings, a list of token ids or a list of token-id "
            f"lists, got {type(prompt).__name__}",
            "invalid_type",
        )
    if not prompt:
        return 1
    lists = sum(isinstance(p, list) for p in prompt)
    if lists == len(prompt) or all(isinstance(p, str) for p in prompt):
        return len(prompt)  # a batch
    if lists == 0:
        return 1  # token ids (in lax mode vLLM reads "12" and 12.0 as ids too; it checks them)
    raise InvalidParameter(
        "prompt", "prompt must not mix token-id lists with strings or token ids in one list", "invalid_type"
    )


def check_messages(messages: Any) -> bool:
    """Chat ``messages`` in a shape the price reads (vLLM refuses every fault named here);
    True when a part is a media part (an image to count). A part's ``uuid`` is a 400 (vLLM does
    accept it, as the image's cache key, but that key is shared by every tenant)."""
    if not isinstance(messages, list):
        raise InvalidParameter(
            "messages", f"messages must be a list, got {type(messages).__name__}", "invalid_type"
        )
    media = False
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidParameter(
                where, f"{where} must be an object, got {type(message).__name__}", "invalid_type"
            )
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise InvalidParameter(
                f"{where}.content",
                f"{where}.content must be a string or a list of content parts, got {type(content).__name__}",
                "invalid_type",
            )
        for j, part in enumerate(content):
            at = f"{where}.content[{j}]"
            if isinstance(part, str):
                continue
            if not isinstance(part, dict):
                raise InvalidParameter(
                    at, f"{at} must be a content part object, got {type(part).__name__}", "invalid_type"
                )
            if part.get("uuid") is not None:
                # vLLM takes a part's uuid as the image's hash: its processor, encoder and prefix
                # caches would serve whatever image first came with that uuid, another tenant's
                # (its pixels to this tenant, and its tokens at this part's price).
                raise InvalidParameter(
                    f"{at}.uuid",
                    f"{at}.uuid is not accepted: the engine would key its caches by it across tenants",
                )
            kind = part_kind(part)  # as vLLM reads it: {"image_url": "<url>"} with no type is an image
            if kind is None:
                # vLLM's validation refuses the part; the router could not price it either (a
                # text or an image it would read otherwise), so it never reaches a pod.
                raise _untyped_part(at, part.get("type"))
            if kind not in CHAT_PART_TYPES:
                # vLLM refuses it too (its validation, or "Unsupported chat content part
                # type"), after admission and a pod's round trip: refused here, naming the
                # types it reads.
                raise InvalidParameter(
                    f"{at}.type",
                    f"{at}.type {kind!r} is not a chat content part type the engine reads"
                    f" (supported: {', '.join(sorted(CHAT_PART_TYPES))})",
                )
            if kind not in NON_MEDIA_PART_TYPES:
                media = True  # media parts: priced by their images (no text to price)
                continue
            field = text_field(kind)
            if field in part and not isinstance(part[field], str):
                raise InvalidParameter(
                    f"{at}.{field}",
                    f"{at}.{field} must be a string, got {type(part[field]).__name__}",
                    "invalid_type",
                )
    return media


def _untyped_part(at: str, kind: Any) -> InvalidParameter:
    if kind is not None:
        return InvalidParameter(
            f"{at}.type", f"{at}.type must be a string, got {type(kind).__name__}", "invalid_type"
        )
    return InvalidParameter(
        f"{at}.type",
        f"{at} has no type: a part without one must be a bare media URL such as "
        '{"image_url": "data:image/png;base64,..."}; give a text part "type": "text", an image '
        'part "type": "image_url"',
        "missing",
    )


def demand(
    body: dict[str, Any], chat: bool, max_model_len: int, max_n: int, default_max_tokens: int
) -> Demand:
    """What the request asks the engine to generate, read as the engine will read it on its path
    (``chat``: /v1/chat/completions, else /v1/completions); raises ``InvalidParameter`` (400).

    ``default_max_tokens`` prices a request that sets no budget (the engine's own default is no
    more than the context left), bounded by ``max_model_len``."""
    images = NO_IMAGES
    if chat:
        if body.get("mm_processor_kwargs"):  # None and {} change nothing
            # vLLM passes them to the HF processor: min_pixels / max_pixels (or size) resize
            # every image, a 1 x 1 PNG to 16,384 tokens, past the resolution the router prices.
            raise InvalidParameter(
                "mm_processor_kwargs",
                "is not accepted: images are priced at the served resolution, which it would change",
            )
        if "messages" in body and check_messages(body["messages"]):
            images = count_images(body["messages"])
        prompts = 1
        max_tokens = body.get("max_tokens")  # vLLM validates both fields ...
        if max_tokens is not None and type(max_tokens) is not int:  # no call in the common case
            max_tokens = _int_param(body, "max_tokens")
        completion_tokens = body.get("max_completion_tokens")
        if completion_tokens is not None and type(completion_tokens) is not int:
            completion_tokens = _int_param(body, "max_completion_tokens")
        name = "max_tokens" if completion_tokens is None else "max_completion_tokens"
        budget = max_tokens if completion_tokens is None else completion_tokens  # ... honours one
        least = 1
    else:
        prompt = body.get("prompt")
        prompts = 1 if prompt is None or isinstance(prompt, str) else prompt_count(prompt)
        name, budget = "max_tokens", body.get("max_tokens")
        least = 0 if "echo" in body and lax_bool(body["echo"]) else 1  # echo and 0: the prompt alone
        if budget is not None and type(budget) is not int:  # no call in the common case
            budget = _int_param(body, name)
    if budget is None:
        budget = min(default_max_tokens, max_model_len)
    elif not least <= budget <= max_model_len:
        raise _out_of_range(name, budget, least, max_model_len, "the model's context length, max_model_len")
    n = _int_param(body, "n") if "n" in body else None  # most requests set none
    if n is None:
        n = 1
    elif not 1 <= n <= max_n:
        raise _out_of_range("n", n, 1, max_n, "the router's max_n")
    return _new_tuple(Demand, (prompts, n, budget, images))  # per request: no NamedTuple __new__ frame


def check_context(
    body: dict[str, Any], chat: bool, max_model_len: int, max_token_bytes: int, image_tokens: int = 0
) -> None:
    """Refuse (``context_exceeded``) a prompt the engine surely refuses for length: more tokens
    than the context (``max_model_len``) even at the fewest it can be. Token ids count exactly;
    text at ``max_token_bytes`` UTF-8 bytes a token, the most one token of the pods' tokenizer
    holds (the simulated engine's 4: its own count, so the router refuses what it refuses; 0
    where the tokenizer is not known: the text is the engine's to measure, and its 400 costs
    nothing, ``pricing.metered``). A chat counts its messages' contents (each rendered, and at
    least that, by any template) and its images; a batch, each prompt in turn, as vLLM does.

    With max_model_len 512 and 4 bytes a token: a 2,052-byte prompt (513 tokens at least) is a
    400, a 2,048-byte one is the engine's to answer, as is any text of an unknown tokenizer.
    A request with ``truncate_prompt_tokens`` is the engine's too: vLLM cuts the prompt to that
    many tokens before it measures it (renderers/params.py TokenizeParams)."""
    if body.get("truncate_prompt_tokens") is not None:
        return
    if chat:
        least = image_tokens
        messages = body.get("messages")
        if max_token_bytes and isinstance(messages, list):
            for m in messages:
                if isinstance(m, dict):
                    least += estimate_tokens(content_bytes(m.get("content")), max_token_bytes)
        if least > max_model_len:
            raise context_exceeded(max_model_len)
        return
    prompt = body.get("prompt")
    prompts = [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        prompts = prompt  # a batch of strings or of token-id lists
    for item in prompts:
        if isinstance(item, list):  # token ids
            if len(item) > max_model_len:
                raise context_exceeded(max_model_len, len(item))
        elif isinstance(item, str) and max_token_bytes:
            if estimate_tokens(text_bytes(item), max_token_bytes) > max_model_len:
                raise context_exceeded(max_model_len)


def context_exceeded(max_model_len: int, token_ids: int | None = None) -> RequestError:
    """vLLM's 400 for a prompt past the context (renderers/params.py, as the simulated engine
    words it): its type, its code, its message. vLLM tokenizes text no further than one token
    past the context, so a text prompt "contains at least max_model_len + 1 input tokens"; a
    token-id prompt, its count (``token_ids``)."""
    shown = max_model_len + 1 if token_ids is None else token_ids
    message = (
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
        f"contains {'at least ' if token_ids is None else ''}{shown} input tokens, which exceeds this "
        "limit even without any output tokens. Please reduce the length of the input prompt. "
        f"(parameter=input_tokens, value={shown})"
    )
    return RequestError(400, message, 400, param="input_tokens", kind="BadRequestError")
