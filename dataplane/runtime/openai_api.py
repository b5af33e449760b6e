"""The subset of vLLM's OpenAI-compatible API that the simulated engine speaks. Pure: no I/O.

Parses and validates completion / chat-completion bodies into a ``ParsedRequest`` or an
``ApiError`` carrying vLLM's status and error body, and builds response bodies. The error body
follows the installed vLLM (0.32): ``{"error": {"message", "type", "param", "code"}}``. (Older
vLLM releases sent a flat ``{"object": "error", "message", ...}``; clients should read both.)

Token counts are a deterministic estimate, since there is no tokenizer: a text prompt counts
ceil(characters / 4) tokens (the usual ~4 characters per English BPE token; "Hello world!" ->
3), at least 1; a prompt given as token ids counts its length; a chat counts the estimate of
each message's text plus 4 tokens per message for the template's role markers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4  # estimate for text prompts, characters per token
CHAT_TOKENS_PER_MESSAGE = 4  # template overhead per chat message, tokens
SIM_WORDS = ("sim", "ulated", " token", " text", ".", " The", " engine", " says")


@dataclass(frozen=True)
class ApiError(Exception):
    status: int  # HTTP status
    message: str
    err_type: str = "BadRequestError"  # vLLM/OpenAI error type
    param: str | None = None  # offending field

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.err_type,
                "param": self.param,
                "code": self.status,
            }
        }


@dataclass(frozen=True)
class ParsedRequest:
    chat: bool  # /v1/chat/completions rather than /v1/completions
    model: str  # served model name (defaulted when the body omits it, as vLLM does)
    prompt_tokens: int  # tokens
    max_tokens: int  # output tokens the sim will generate, >= 1
    priority: int  # lower is earlier
    stream: bool
    include_usage: bool  # stream_options.include_usage


def estimate_text_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def _prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, str) and prompt:
        return estimate_text_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return len(prompt)
        if len(prompt) == 1:
            return _prompt_tokens(prompt[0])
        raise ApiError(400, "The simulated engine serves one prompt per request.", param="prompt")
    raise ApiError(400, "Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")


def _message_tokens(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "Field required", param="messages")
    total = 0
    for msg in messages:
        if not isinstance(msg, dict) or "role" not in msg:
            raise ApiError(400, "Each message needs a role", param="messages")
        content = msg.get("content") or ""
        if isinstance(content, list):  # content parts: count the text ones
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        total += CHAT_TOKENS_PER_MESSAGE + math.ceil(len(str(content)) / CHARS_PER_TOKEN)
    return total


def _int_field(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"Input should be a valid integer: {name}={value!r}", param=name)
    return value


def parse_request(
    raw: bytes, chat: bool, served_model: str, max_model_len: int, default_max_tokens: int
) -> ParsedRequest:
    """Validate a request body as vLLM would; raises ApiError (400/404)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "JSON decode error", param="body") from None
    if not isinstance(body, dict):
        raise ApiError(400, "Input should be a valid dictionary or object", param="body")
    model = body.get("model") or served_model
    if model != served_model:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    prompt_tokens = _message_tokens(body.get("messages")) if chat else _prompt_tokens(body.get("prompt"))
    if prompt_tokens >= max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. "
            f"However, your prompt contains {prompt_tokens} input tokens, which "
            "exceeds this limit even without any output tokens. Please reduce the "
            "length of the input prompt.",
            param="input_tokens",
        )
    requested = _int_field(
        body, "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens", None
    )
    if requested is not None and requested < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {requested}.", param="max_tokens")
    # vLLM clamps max_tokens to the context left; with no EOS the sim needs a finite default.
    max_tokens = min(requested or default_max_tokens, max_model_len - prompt_tokens)
    if (_int_field(body, "n", 1) or 1) != 1:
        raise ApiError(400, "The simulated engine supports n=1 only.", param="n")
    priority = _int_field(body, "priority", 0) or 0
    stream = bool(body.get("stream", False))
    options = body.get("stream_options") or {}
    include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    return ParsedRequest(chat, model, prompt_tokens, max_tokens, priority, stream, include_usage)


def token_text(index: int) -> str:
    """The sim's deterministic text for output token ``index``."""
    return SIM_WORDS[index % len(SIM_WORDS)]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def full_response(
    req: ParsedRequest, request_id: str, created: int, generated: int, finish_reason: str
) -> dict[str, Any]:
    text = "".join(token_text(i) for i in range(generated))
    if req.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {
        "id": request_id,
        "object": obj,
        "created": created,
        "model": req.model,
        "choices": [choice],
        "usage": usage(req.prompt_tokens, generated),
    }


def stream_chunk(
    req: ParsedRequest, request_id: str, created: int, index: int, finish_reason: str | None
) -> dict[str, Any]:
    """The SSE chunk for output token ``index`` (the chat stream starts with the role)."""
    if req.chat:
        delta: dict[str, Any] = {"content": token_text(index)}
        if index == 0:
            delta = {"role": "assistant", **delta}
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": token_text(index), "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": request_id, "object": obj, "created": created, "model": req.model, "choices": [choice]}


def usage_chunk(req: ParsedRequest, request_id: str, created: int, generated: int) -> dict[str, Any]:
    obj = "chat.completion.chunk" if req.chat else "text_completion"
    return {
        "id": request_id,
        "object": obj,
        "created": created,
        "model": req.model,
        "choices": [],
        "usage": usage(req.prompt_tokens, generated),
    }


def models_body(
    model: str, max_model_len: int, created: int, profile: str, time_scale: float = 1.0
) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": model,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": model,
                "parent": None,
                "max_model_len": max_model_len,
                # Not part of vLLM's card: says plainly that no model is behind this endpoint, and how
                # much faster than real time it runs (a benchmark measures in the engine's time).
                "simulated": True,
                "sim_profile": profile,
                "time_scale": time_scale,
            }
        ],
    }
