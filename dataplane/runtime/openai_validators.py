"""vLLM's checks of a request beyond its fields' types, each refused as vLLM words it. Pure: no I/O.

The request models' ``mode="before"`` validators (``_before_validators``, in the order pydantic
runs them), the prompt's context length, the output budget, ``SamplingParams._verify_args``, and
what the engine refuses as it takes a request (``_engine_error``: a stream has answered 200 by
then, so it is sent as an error event). ``openai_api`` calls them in vLLM's order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dataplane.runtime import sim_tokenizer
from dataplane.runtime.openai_request import (
    MAX_COMPLETION_PROMPTS,
    MAX_LOGPROBS,
    MAX_N_SEQUENCES,
    ApiError,
    Prompt,
    ServedModel,
    invalid,
)
from dataplane.runtime.sim_generation import GREEDY_TEMPERATURE
from dataplane.wire import cache_salt as salt_rule


def _logprobs_checks(raw: dict[str, Any], chat: bool) -> None:
    """The ``check_logprobs`` validators of both request models."""
    name = "top_logprobs" if chat else "logprobs"
    for field in ("prompt_logprobs", name):
        value = raw.get(field)
        if value is not None and not isinstance(value, (int, float)):
            raise invalid(f"`{field}` must be an integer.", field, value)
    if (prompt_logprobs := raw.get("prompt_logprobs")) is not None:
        if raw.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
            raise invalid("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        if prompt_logprobs < 0 and prompt_logprobs != -1:
            raise invalid(
                "`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs", prompt_logprobs
            )
    if (count := raw.get(name)) is not None:
        if count < 0 and count != -1:
            raise invalid(f"`{name}` must be a positive value or -1.", name, count)
        if chat and (count == -1 or count > 0) and not raw.get("logprobs"):
            raise invalid("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")


def _generation_prompt_check(raw: dict[str, Any]) -> None:
    if raw.get("continue_final_message") and raw.get("add_generation_prompt"):
        raise invalid("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")


def _stream_options_check(raw: dict[str, Any]) -> None:
    if raw.get("stream_options") and not raw.get("stream"):
        raise invalid("Stream options can only be defined when `stream=True`.", "stream_options")


def _prompt_count_check(raw: dict[str, Any]) -> None:
    prompt = raw.get("prompt")
    if isinstance(prompt, list) and not all(isinstance(p, int) for p in prompt):
        if len(prompt) > MAX_COMPLETION_PROMPTS:
            raise invalid(
                f"prompt list length {len(prompt)} exceeds the maximum allowed count of "
                f"{MAX_COMPLETION_PROMPTS}. To increase this limit, set the VLLM_MAX_COMPLETION_PROMPTS "
                "environment variable.",
                "prompt",
            )


def _prompt_given_check(raw: dict[str, Any]) -> None:
    if raw.get("prompt") is None or raw.get("prompt") == "":
        raise invalid("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")


def _cache_salt_check(raw: dict[str, Any]) -> None:
    """``cache_salt``: absent or null (no salt), else a non-empty string of at most 128
    characters without '@', '/', '\\' or NUL (both request models' check_cache_salt_support)."""
    refused = salt_rule.fault(raw.get("cache_salt"))
    if refused == "type":
        raise invalid("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    if refused == "content":
        raise invalid(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain "
            "'@', '/', '\\\\', or NUL.",
            "cache_salt",
        )


def _before_validators(raw: dict[str, Any], chat: bool) -> None:
    """The request model's ``mode="before"`` validators that can refuse, in the order they run
    (the reverse of their definition)."""
    if chat:
        _generation_prompt_check(raw)
        _logprobs_checks(raw, chat)
        _stream_options_check(raw)
    else:
        _prompt_count_check(raw)
        _prompt_given_check(raw)
        _stream_options_check(raw)
        _logprobs_checks(raw, chat)
    _cache_salt_check(raw)  # defined first in both models: it runs last


def _context_check(ids: list[int], text: str | None, served: ServedModel) -> None:
    """A prompt within the context (renderers/params.py). A text prompt (``text`` given) is first
    bounded in characters (_text_len_check), then tokenized to at most max_model_len + 1 tokens,
    so vLLM can only say "at least" that many (_token_len_check)."""
    limit = served.max_model_len
    max_chars = limit * sim_tokenizer.MAX_CHARS_PER_TOKEN
    if text is not None and len(text) > max_chars:
        raise invalid(
            f"This model's maximum context length is {limit} tokens. However, your prompt contains "
            f"{len(text)} characters (more than {max_chars} characters, which is the upper bound for "
            f"{limit} input tokens). Please reduce the length of the input prompt.",
            "input_text",
            len(text),
        )
    if len(ids) > limit:
        shown = len(ids) if text is None else min(len(ids), limit + 1)
        qualifier = "at least " if text is not None and shown == limit + 1 else ""
        raise invalid(
            f"This model's maximum context length is {limit} tokens. However, your prompt contains "
            f"{qualifier}{shown} input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt.",
            "input_tokens",
            shown,
        )


@dataclass(frozen=True)
class _Sampling:
    n: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    min_tokens: int
    stop: tuple[str, ...]


def _verify_sampling(s: _Sampling, max_tokens: int) -> None:
    """SamplingParams._verify_args and its greedy check (sampling_params.py), in their order."""
    if s.n < 1:
        raise invalid(f"n must be at least 1, got {s.n}.")
    if s.n > MAX_N_SEQUENCES:
        raise invalid(
            f"n must be at most {MAX_N_SEQUENCES}, got {s.n}. To increase this limit, set the "
            "VLLM_MAX_N_SEQUENCES environment variable."
        )
    if not -2.0 <= s.presence_penalty <= 2.0:
        raise invalid(f"presence_penalty must be in [-2, 2], got {s.presence_penalty}.")
    if not -2.0 <= s.frequency_penalty <= 2.0:
        raise invalid(f"frequency_penalty must be in [-2, 2], got {s.frequency_penalty}.")
    if not math.isfinite(s.repetition_penalty):
        raise invalid(f"repetition_penalty must be a finite number, got {s.repetition_penalty}.")
    if s.repetition_penalty <= 0.0:
        raise invalid(f"repetition_penalty must be greater than zero, got {s.repetition_penalty}.")
    if not math.isfinite(s.temperature):
        raise invalid(
            f"temperature must be a finite number, got {s.temperature}.", "temperature", s.temperature
        )
    if s.temperature < 0.0:
        raise invalid(f"temperature must be non-negative, got {s.temperature}.", "temperature", s.temperature)
    if s.temperature > 2.0:
        raise invalid(f"temperature must be in [0, 2], got {s.temperature}.", "temperature", s.temperature)
    if not 0.0 < s.top_p <= 1.0:
        raise invalid(f"top_p must be in (0, 1], got {s.top_p}.", "top_p", s.top_p)
    if s.top_k < -1:
        raise invalid(f"top_k must be 0 (disable), or at least 1, got {s.top_k}.")
    if not 0.0 <= s.min_p <= 1.0:
        raise invalid(f"min_p must be in [0, 1], got {s.min_p}.")
    if max_tokens < 1:
        raise invalid(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
    if s.min_tokens < 0:
        raise invalid(f"min_tokens must be greater than or equal to 0, got {s.min_tokens}.")
    if s.min_tokens > max_tokens:
        raise invalid(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {s.min_tokens}."
        )
    if any(not stop for stop in s.stop):
        raise invalid("stop cannot contain an empty string.")
    if s.temperature < GREEDY_TEMPERATURE and s.n > 1:
        raise invalid(f"n must be 1 when using greedy sampling, got {s.n}.")


def _engine_error(
    prompts: tuple[Prompt, ...], logprobs: int | None, prompt_logprobs: int | None
) -> ApiError | None:
    """What v1/engine/input_processor.py refuses (SamplingParams._validate_logprobs, then
    _validate_model_input): -1 means the whole vocabulary."""
    for name, count in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
        wanted = sim_tokenizer.VOCAB_SIZE if count == -1 else count
        if wanted and wanted > MAX_LOGPROBS:
            kind = "sample" if name == "logprobs" else "prompt"
            return invalid(
                f"Requested {kind} logprobs of {wanted}, which is greater than max allowed: {MAX_LOGPROBS}",
                name,
                wanted,
            )
    for prompt in prompts:
        if not prompt.token_ids:
            return invalid("The decoder prompt cannot be empty")
        if (largest := max(prompt.token_ids)) >= sim_tokenizer.VOCAB_SIZE:
            return invalid(f"Token id {largest} is out of vocabulary")
    return None


def _max_tokens_budget(requested: int | None, name: str, served: ServedModel) -> None:
    """renderers/params.py TokenizeParams: the output budget alone may not exceed the context."""
    if requested is not None and requested > served.max_model_len:
        raise invalid(
            f"{name}={requested} cannot be greater than max_model_len={served.max_model_len}. "
            "Please request fewer output tokens.",
            name,
            requested,
        )
