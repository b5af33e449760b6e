"""What the router prices a request from, read as vLLM reads it (``validation.demand``): worked
values, the parameter each path honours, and the 400s that name the parameter at fault."""

import json

import pytest

from dataplane.router.admission import clamp_tenant_priority, is_probe
from dataplane.router.images import ImageCount
from dataplane.router.validation import Demand, InvalidParameter, demand, lax_int
from tests.image_files import image_part, png

CTX = 8192  # max_model_len


def chat(body, max_n=128, default=256):
    return demand(body, True, CTX, max_n, default)


def completion(body, max_n=128, default=256):
    return demand(body, False, CTX, max_n, default)


def refused(fn, body):
    with pytest.raises(InvalidParameter) as e:
        fn(body)
    assert e.value.status == 400
    return e.value


def test_lax_integers_are_what_pydantic_reads_in_lax_mode():
    assert [lax_int(v) for v in (12, 12.0, "12", " 12 ", True, "1e3")] == [12, 12, 12, 12, 1, 1000]
    assert [lax_int(v) for v in (12.5, float("inf"), "x", None, [], {})] == [None] * 6
    assert lax_int(json.loads("1e400")) is None  # Python's json reads 1e400 as inf
    assert lax_int(10**400) == 10**400  # ... and 10**400 as an int: the range refuses it


def test_each_path_prices_the_budget_its_engine_honours():
    # chat: max_completion_tokens wins over max_tokens (vLLM ChatCompletionRequest)
    assert chat({"max_completion_tokens": 1, "max_tokens": 200}) == Demand(1, 1, 1)
    assert chat({"max_tokens": 200}) == Demand(1, 1, 200)
    # ... and the one it ignores may be anything vLLM accepts, even above the context
    assert chat({"max_completion_tokens": 10, "max_tokens": 10**26}).max_tokens == 10
    # completions: max_completion_tokens is an unknown field the engine ignores
    assert completion({"prompt": "hi", "max_completion_tokens": 1, "max_tokens": 200}) == Demand(1, 1, 200)
    assert completion({"prompt": "hi", "max_completion_tokens": "junk"}).max_tokens == 256  # the default
    assert completion({"prompt": "hi", "max_tokens": "12"}).max_tokens == 12  # lax, as vLLM


def test_a_batch_of_prompts_times_n_is_every_sequence_generated():
    assert completion({"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 100}).output_tokens == 600
    assert completion({"prompt": [[1, 2], [3], [4]], "max_tokens": 10}).output_tokens == 30
    assert completion({"prompt": [1, 2, 3], "max_tokens": 10}).output_tokens == 10  # one id prompt
    assert completion({"prompt": "abc", "n": 3, "max_tokens": 10}).output_tokens == 30
    assert (
        chat({"messages": [{"role": "user", "content": "hi"}], "n": 4, "max_tokens": 5}).output_tokens == 20
    )
    assert completion({}, default=10_000_000).max_tokens == CTX  # a default never above the context


@pytest.mark.parametrize(
    ("fn", "body", "param"),
    [
        (completion, {"prompt": "x", "max_tokens": 10**26}, "max_tokens"),
        (completion, {"prompt": "x", "max_tokens": 10**400}, "max_tokens"),
        (completion, {"prompt": "x", "max_tokens": json.loads("1e400")}, "max_tokens"),
        (completion, {"prompt": "x", "max_tokens": CTX + 1}, "max_tokens"),
        (completion, {"prompt": "x", "max_tokens": -1}, "max_tokens"),
        (completion, {"prompt": "x", "max_tokens": 0}, "max_tokens"),  # vLLM: at least 1 (after tokenising)
        (completion, {"prompt": "x", "max_tokens": 0, "echo": 0}, "max_tokens"),
        (chat, {"max_tokens": 0, "echo": True}, "max_tokens"),  # chat's echo does not take 0
        (chat, {"max_completion_tokens": 0, "max_tokens": 5}, "max_completion_tokens"),
        (completion, {"prompt": "x", "max_tokens": 2.5}, "max_tokens"),
        (completion, {"prompt": "x", "max_tokens": "lots"}, "max_tokens"),
        (completion, {"prompt": "x", "max_tokens": [5]}, "max_tokens"),
        (chat, {"max_completion_tokens": 10**26, "max_tokens": 1}, "max_completion_tokens"),
        (chat, {"max_tokens": 10**26}, "max_tokens"),
        (chat, {"max_completion_tokens": 5, "max_tokens": "lots"}, "max_tokens"),  # vLLM checks both
        (completion, {"prompt": "x", "n": 10**400}, "n"),
        (completion, {"prompt": "x", "n": 0}, "n"),
        (completion, {"prompt": "x", "n": 129}, "n"),
        (chat, {"n": "two"}, "n"),
        (completion, {"prompt": 5}, "prompt"),
        (completion, {"prompt": {"text": "x"}}, "prompt"),
        (completion, {"prompt": ["a", [1]]}, "prompt"),
        (chat, {"messages": "hello"}, "messages"),
        (chat, {"messages": ["hello"]}, "messages[0]"),
        (chat, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (chat, {"messages": [{"role": "user", "content": {"text": "x"}}]}, "messages[0].content"),
        (chat, {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
         "messages[0].content[0].text"),
        (chat, {"messages": [{"role": "user", "content": [{"type": "tool_reference", "name": 5}]}]},
         "messages[0].content[0].name"),
        (chat, {"messages": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]},
         "messages[0].content[0].type"),
        # vLLM's validation refuses a part without a type unless it is a bare URL string
        (chat, {"messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages[0].content[0].type"),
        (chat, {"messages": [{"role": "user", "content": ["a", {}]}]}, "messages[0].content[1].type"),
        (chat, {"messages": [{"role": "user", "content": [{"type": None, "image_url": {"url": "data:,"}}]}]},
         "messages[0].content[0].type"),
        (chat, {"messages": [{"role": "user", "content": [{"type": ["text"], "text": "x"}]}]},
         "messages[0].content[0].type"),
        (chat, {"messages": [{"role": "user", "content": ["ok", 7]}]}, "messages[0].content[1]"),
        (chat, {"messages": [{"role": "u", "content": [{"type": "refusal", "refusal": []}]}]},
         "messages[0].content[0].refusal"),
    ],
)  # fmt: skip
def test_a_bad_value_is_a_400_naming_the_parameter(fn, body, param):
    err = refused(fn, body)
    assert err.param == param and param.split("[")[0].split(".")[0] in err.message
    assert len(err.message) < 300  # 10**400 is not echoed whole


def test_what_vllm_accepts_is_never_refused():
    messages = [
        {"role": "system", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {
            "role": "user",
            "content": ["text", {"type": "text", "text": "t"}, image_part(png(448, 448))],
        },
    ]
    asked = chat({"messages": messages, "max_tokens": CTX, "n": "2", "best_of": 10**400})
    assert asked == Demand(1, 2, CTX, ImageCount(1, 256, len(png(448, 448))))  # priced by its tokens
    assert completion({"prompt": ["1", 2.0], "max_tokens": True}) == Demand(1, 1, 1)  # lax token ids
    assert completion({"prompt": [], "max_tokens": 1, "n": None}) == Demand(1, 1, 1)  # the engine's to refuse
    # vLLM: echo with max_tokens 0 returns the prompt alone (its only budget of 0)
    assert completion({"prompt": "hi", "max_tokens": 0, "echo": "yes"}) == Demand(1, 1, 0)
    assert chat({"n": 128}, max_n=128).n == 128


def test_the_probe_class_needs_the_credential():
    assert not is_probe(b"1", None) and not is_probe(b"s3cret", None)  # no credential: no probes
    assert not is_probe(b"1", b"s3cret") and not is_probe(None, b"s3cret")
    assert is_probe(b"s3cret", b"s3cret")


@pytest.mark.parametrize(
    ("priority", "forwarded", "changed"),
    [(-1000, 0, True), ("-5", 0, True), (-3.0, 0, True), (0, 0, False), (7, 7, False), (-2.5, -2.5, False)],
)
def test_a_tenant_priority_is_clamped_to_the_tenants_range(priority, forwarded, changed):
    body = {"model": "m", "priority": priority}
    assert clamp_tenant_priority(body) is changed
    assert body["priority"] == forwarded  # -2.5: not an integer, the engine refuses it
