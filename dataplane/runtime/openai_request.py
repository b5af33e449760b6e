"""A request body of vLLM's OpenAI-compatible API read as vLLM reads it. Pure: no I/O.

The framing (``_json_body``: content type ``application/json``, valid JSON, an object), the
fields read as pydantic reads JSON (``Body``, lax mode), vLLM's error bodies (``ApiError``,
``invalid``, ``field_errors``), the model check, and what a parsed request is (``ServedModel``,
``Prompt``, ``ParsedRequest``). The endpoints (``openai_api``) build on it; how they check, in
vLLM's order: docs/runtime-pods.md, "How the simulated engine reads a request".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine_model.vision import VisionProfile

# vLLM's limits: envs.py VLLM_MAX_COMPLETION_PROMPTS, VLLM_MAX_STOP_STRINGS, VLLM_MAX_N_SEQUENCES,
# config/model.py max_logprobs (its default).
MAX_COMPLETION_PROMPTS = 1024
MAX_STOP_STRINGS = 4
MAX_N_SEQUENCES = 16384
MAX_LOGPROBS = 20
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
COMPLETION_DEFAULT_MAX_TOKENS = 16  # CompletionRequest.max_tokens default
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
    engine_error: ApiError | None  # refused as the engine takes it (openai_validators._engine_error)
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
