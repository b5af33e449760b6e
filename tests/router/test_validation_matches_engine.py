"""The router refuses nothing the engine accepts: each body here goes to the real simulated engine
(our copy of vLLM 0.32's rules, tiny-test: max_model_len 512) and through ``validation.demand``
with the engine's own limits; whenever the router refuses, the engine answers 400 too."""

import json

import pytest

from dataplane.router.http import RequestError, error_body
from dataplane.router.validation import InvalidParameter, check_context, demand, lax_bool
from tests.runtime.support import http, sim_engine

pytestmark = pytest.mark.stack  # a simulated engine as a subprocess

CTX = 512
MSG = [{"role": "user", "content": "hi"}]
COMPLETIONS = [
    {"prompt": "hi", "max_tokens": 5},
    {"prompt": "hi", "max_tokens": 5.0},
    {"prompt": "hi", "max_tokens": "5"},
    {"prompt": "hi", "max_tokens": True},
    {"prompt": "hi", "max_tokens": 5.5},
    {"prompt": "hi", "max_tokens": -1},
    {"prompt": "hi", "max_tokens": CTX},
    {"prompt": "hi", "max_tokens": CTX + 1},
    {"prompt": "hi", "max_tokens": 10**26},
    {"prompt": "hi", "max_tokens": "lots"},
    {"prompt": "hi", "max_tokens": 4, "max_completion_tokens": 10**26},
    {"prompt": "hi", "max_tokens": 4, "max_completion_tokens": "junk"},
    {"prompt": ["a", "b"], "max_tokens": 4, "n": 2, "temperature": 1.0},
    {"prompt": [1, 2, 3], "max_tokens": 4},
    {"prompt": [[1, 2], [3]], "max_tokens": 4},
    {"prompt": ["1", 2.0], "max_tokens": 4},
    {"prompt": ["a", [1]], "max_tokens": 4},
    {"prompt": {"a": 1}, "max_tokens": 4},
    {"prompt": 5, "max_tokens": 4},
    {"prompt": "hi", "max_tokens": 4, "n": 0},
    {"prompt": "hi", "max_tokens": 4, "n": "2", "temperature": 1.0},
    {"prompt": "hi", "max_tokens": 4, "n": 2.5},
    {"prompt": "hi", "max_tokens": 4, "n": 10**400},
    {"prompt": "hi", "max_tokens": 4, "best_of": 10**400},
]
CHATS = [
    {"messages": MSG, "max_tokens": 5},
    {"messages": MSG, "max_completion_tokens": 5, "max_tokens": 10**26},
    {"messages": MSG, "max_completion_tokens": 10**26, "max_tokens": 5},
    {"messages": MSG, "max_completion_tokens": 5, "max_tokens": "lots"},
    {"messages": MSG, "max_tokens": None, "max_completion_tokens": 3},
    {"messages": "hi", "max_tokens": 5},
    {"messages": ["hi"], "max_tokens": 5},
    {"messages": [{"role": "user", "content": 5}], "max_tokens": 5},
    {"messages": [{"role": "user", "content": {"text": "x"}}], "max_tokens": 5},
    {"messages": [{"role": "user", "content": [{"text": 5}]}], "max_tokens": 5},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}], "max_tokens": 5},
    {"messages": [{"role": "user", "content": [{"text": "x"}]}], "max_tokens": 5},
    {"messages": [{"role": "user", "content": [{"type": None, "text": "x"}]}], "max_tokens": 5},
    {"messages": [{"role": "user", "content": [{}]}], "max_tokens": 5},
    {"messages": [{"role": "user", "content": [{"image_url": {"url": "data:,"}}]}], "max_tokens": 5},
    {"messages": [{"role": "user", "content": [7]}], "max_tokens": 5},
    {"messages": [{"role": "user", "content": ["a", {"type": "text", "text": "b"}]}], "max_tokens": 5},
    {"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": []}]}], "max_tokens": 5},
    {"messages": [{"role": "user", "content": [{"type": "tool_reference", "name": 5}]}], "max_tokens": 5},
    {"messages": [{"role": "user", "content": [{"type": "tool_reference", "name": "t"}]}], "max_tokens": 5},
    {"messages": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}], "max_tokens": 5},
    {"messages": [{"role": "user", "content": [{"type": "blob", "text": "x"}]}], "max_tokens": 5},
]


@pytest.fixture(scope="module")
def engine():
    with sim_engine("--profile", "tiny-test", "--time-scale", "100", "--served-model-name", "m") as sim:
        yield sim


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/completions", b) for b in COMPLETIONS] + [("/v1/chat/completions", b) for b in CHATS],
)
def test_what_the_router_refuses_the_engine_refuses(engine, path, body):
    chat = path.endswith("chat/completions")
    try:
        demand(body, chat, CTX, 16_384, 256)  # vLLM's own n limit: this compares the rules, not max_n
        refused = None
    except InvalidParameter as exc:
        refused = exc
    status, _, answer = http("POST", engine.url + path, json.dumps({"model": "m", **body}).encode())
    if refused is not None:
        assert status == 400, (refused.param, answer)
    else:
        assert status in (200, 400), answer  # accepted by the router: the engine may still refuse


FLAGS = [True, False, 1, 0, 1.0, 2, "true", "False", "1", "0", "yes", "NO", "on", "off", "t", "f", "y", "n",
         " true ", "maybe", "", None, [], {}]  # fmt: skip


@pytest.mark.parametrize("flag", FLAGS, ids=repr)
def test_the_router_reads_stream_flags_as_the_engine_does(engine, flag):
    """``stream`` and ``stream_options.include_usage``: what ``lax_bool`` reads as true the engine
    streams (with the usage chunk), as false it answers whole, as None it refuses (400)."""
    for body in (
        {"prompt": "hi", "max_tokens": 2, "stream": flag},
        {"prompt": "hi", "max_tokens": 2, "stream": True, "stream_options": {"include_usage": flag}},
    ):
        raw = json.dumps({"model": "m", **body}).encode()
        status, _, answer = http("POST", engine.url + "/v1/completions", raw)
        value = lax_bool(flag)
        if flag is None:  # null: the field's default (false)
            value = False
        if value is None:
            assert status == 400, answer
            continue
        assert status == 200, answer
        streamed = b"data: " in answer
        if "stream_options" in body:
            assert streamed and (b'"choices": []' in answer or b'"choices":[]' in answer) == value, answer
        else:
            assert streamed == value, answer


E = "\U0001f600"  # 4 UTF-8 bytes, one token of the engine
PARTS = {"role": "user", "content": [E] * 300}  # parts the engine joins with newlines: 1,499 bytes
# path, body, whether the router refuses it itself (else only the engine can tell)
AT_THE_CONTEXT = [
    ("/v1/completions", {"prompt": "x" * (4 * CTX)}, False),  # 512 tokens: the engine's 400 (no room)
    ("/v1/completions", {"prompt": "x" * (4 * CTX + 1)}, True),
    ("/v1/completions", {"prompt": E * (CTX - 1)}, False),
    ("/v1/completions", {"prompt": E * (CTX + 1)}, True),
    ("/v1/completions", {"prompt": "\u00e9" * (2 * CTX - 2)}, False),
    ("/v1/completions", {"prompt": [5] * CTX}, False),
    ("/v1/completions", {"prompt": [5] * (CTX + 1)}, True),
    ("/v1/completions", {"prompt": [[5] * 10, [5] * (CTX + 3)]}, True),
    ("/v1/completions", {"prompt": ["hi", "y" * (4 * CTX + 8)]}, True),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * (4 * CTX - 16)}]}, False),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * (4 * CTX + 4)}]}, True),
    ("/v1/chat/completions", {"messages": [PARTS, {"role": "user", "content": E * 205}]}, False),
    ("/v1/chat/completions", {"messages": [PARTS, {"role": "user", "content": E * 220}]}, True),
]


@pytest.mark.parametrize(("path", "body", "router_refuses"), AT_THE_CONTEXT)
def test_a_prompt_the_router_finds_past_the_context_the_engine_refuses_in_the_same_words(
    engine, path, body, router_refuses
):
    """``check_context`` with the engine's context and its 4 bytes a token: whatever it refuses,
    the engine refuses with the same body; what it passes, the engine may take or refuse."""
    body = {"model": "m", "max_tokens": 4, **body}
    chat = path.endswith("chat/completions")
    try:
        check_context(body, chat, CTX, 4)
        refused = None
    except RequestError as exc:
        refused = exc
    assert (refused is not None) == router_refuses
    status, _, answer = http("POST", engine.url + path, json.dumps(body).encode())
    if refused is not None:
        assert status == 400 and json.loads(answer) == json.loads(
            error_body(400, refused.message, refused.code, refused.param, refused.kind)
        )
