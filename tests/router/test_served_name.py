"""A renamed endpoint through the router, on real sockets to simulated engines: its pods keep
serving the name it was created under ("chat"), the router sends them that name and gives the
client the name it asked for ("assistant") in every answer and stream chunk, byte for byte
the engine's answer otherwise; the old name reaches the endpoint that took it, or nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest

from dataplane.router.proxy import pod_body
from dataplane.router.served_name import AnswerName
from dataplane.wire.routing_table import ReservedRate, RoutedPod, RoutingTable
from tests.installed_vllm import vllm_python_or_skip
from tests.router.conftest import (
    TENANT_KEY,
    assert_idle,
    call,
    error_of,
    running,
    table_doc,
    with_config,
)
from tests.runtime.support import SimProcess, sim_engine

SERVED, NEW = "chat", "assistant"  # created as "chat", renamed "assistant"
PROMPT = "Tell me about the weather in the mountains"


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[SimProcess, SimProcess]]:
    """The renamed endpoint's pod and the pod of a second endpoint created as "chat" since:
    both serve "chat", as the cluster driver starts them."""
    args = ("--profile", "tiny-test", "--time-scale", "50", "--served-model-name", SERVED)
    with sim_engine(*args) as renamed, sim_engine(*args) as second:
        yield renamed, second


def table(renamed: SimProcess, second: SimProcess | None = None) -> RoutingTable:
    """Endpoint 1 renamed "assistant" (pods serving "chat"); with ``second``, endpoint 2 "chat"
    on its own pod; as a router reads the table from the control plane."""
    doc = table_doc(
        [],
        name=NEW,
        served_model_name=SERVED,
        reservation=ReservedRate(1e6, best_effort_allowed=True),
        pods=(RoutedPod("ep-1-v1-1", renamed.url, True),),
    )
    if second is not None:
        first = doc["endpoints"][0]
        pod = RoutedPod("ep-2-v1-1", second.url, True).to_json()
        doc["endpoints"].append({**first, "id": 2, "name": SERVED, "pods": [pod]})
    return RoutingTable.from_json(doc)


@contextlib.asynccontextmanager
async def sdk(router: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{router.port}/v1", api_key=TENANT_KEY, max_retries=0, timeout=20
    )
    try:
        yield client
    finally:
        await client.close()


def _norm(data: bytes) -> bytes:
    return re.sub(rb'"created": ?\d+', b'"created": 0', data)  # the engine's clock second


CASES = {
    "completions": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 6}),
    "completions-stream": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "n": 2, "stream": True}),
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 6}),
    "chat-stream-usage": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 6,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
}


@pytest.mark.stack
@pytest.mark.parametrize("case", list(CASES))
def test_a_renamed_endpoint_answers_under_its_new_name_as_its_engine_does(engines, case):
    """The answer is the engine's, byte for byte, but for the name: the one the client asked."""
    path, extra = CASES[case]

    async def go() -> None:
        renamed, _ = engines
        async with running([], table=table(renamed)) as (router, _), httpx.AsyncClient(timeout=10) as http:
            rid = {"x-request-id": f"renamed-{case}"}  # the engine names its answer after it
            direct = await http.post(
                renamed.url + path, json={"model": SERVED, "seed": 3, **extra}, headers=rid
            )
            routed = await http.post(
                f"http://127.0.0.1:{router.port}{path}",
                json={"model": NEW, "seed": 3, **extra},
                headers={**rid, "authorization": f"Bearer {TENANT_KEY}"},
            )
            assert routed.status_code == direct.status_code == 200, routed.text
            assert routed.headers["x-pod"] == "ep-1-v1-1"
            served = _norm(direct.content).replace(b'"model": "chat"', b'"model": "assistant"')
            if "stream_options" in extra:  # the usage the client asked for carries its price
                served = re.sub(rb'("usage": \{[^}]*)\}', rb'\1,"mu": MU}', served)
                assert _norm(re.sub(rb'"mu":[0-9.]+', b'"mu": MU', routed.content)) == served
            else:
                assert _norm(routed.content) == served
            assert b'"model": "chat"' in direct.content and b'"chat"' not in routed.content
            if not extra.get("stream"):
                assert float(routed.headers["x-mu-cost"]) > 0
                assert int(routed.headers["content-length"]) == len(routed.content)
            await assert_idle(router)

    asyncio.run(go())


@pytest.mark.stack
def test_the_openai_sdk_reads_every_answer_and_chunk_under_the_new_name(engines):
    async def go() -> None:
        renamed, _ = engines
        async with running([], table=table(renamed)) as (router, _), sdk(router) as client:
            done = await client.completions.create(model=NEW, prompt=PROMPT, max_tokens=5)
            assert done.model == NEW and done.usage is not None and done.usage.completion_tokens == 5
            chat = await client.chat.completions.create(
                model=NEW, messages=[{"role": "user", "content": PROMPT}], max_tokens=5
            )
            assert chat.model == NEW and chat.choices[0].message.content
            stream = await client.chat.completions.create(
                model=NEW,
                messages=[{"role": "user", "content": PROMPT}],
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [c async for c in stream]
            assert len(chunks) > 5 and {c.model for c in chunks} == {NEW}
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
            listed = await client.models.list()
            assert [m.id for m in listed.data] == [NEW]  # the endpoint's current name
            # metered as any request: three answered, their tokens counted
            s = router.meter.totals[(1, "acme")]
            assert s.requests == 3 and s.tokens_out == 15 and s.mu > 0

    asyncio.run(go())


@pytest.mark.stack
def test_the_old_name_reaches_the_endpoint_that_took_it_or_nothing(engines):
    """Renamed away, "chat" is no endpoint of the tenant's: the router's 404, before any pod,
    unpriced. Once a second endpoint takes the name, "chat" is that one, on its own pods."""

    async def go() -> None:
        renamed, second = engines
        body = {"model": SERVED, "prompt": PROMPT, "max_tokens": 3}
        async with running([], table=table(renamed)) as (router, _):
            status, headers, answer = await call(router, body=body, key=TENANT_KEY)
            assert status == 404 and error_of(answer)["code"] == "model_not_found", answer
            assert "x-mu-cost" not in headers and not router.meter.totals
            router.apply(table(renamed, second))
            for name, pod in ((SERVED, "ep-2-v1-1"), (NEW, "ep-1-v1-1")):
                status, headers, answer = await call(router, body={**body, "model": name}, key=TENANT_KEY)
                assert status == 200 and headers["x-pod"] == pod, answer
                assert json.loads(answer)["model"] == name
            assert {k: s.requests for k, s in router.meter.totals.items()} == {(1, "acme"): 1, (2, "acme"): 1}
            status, _, listed = await call(router, path="/v1/models", method="GET", key=TENANT_KEY)
            assert status == 200 and [m["id"] for m in json.loads(listed)["data"]] == [NEW, SERVED]

    asyncio.run(go())


@pytest.mark.stack
def test_an_answer_too_large_to_hold_passes_through_under_the_new_name(engines):
    """An answer larger than the router holds (here 300 bytes) goes on as it comes, re-framed:
    the name, which changes its length, is put back as it passes."""

    async def go() -> None:
        renamed, _ = engines
        config = with_config(max_body_bytes=300)
        async with running([], table=table(renamed), config=config) as (router, _):
            body = {"model": NEW, "prompt": "hi", "max_tokens": 40}
            status, headers, answer = await call(router, body=body, key=TENANT_KEY)
            assert status == 200 and len(answer) > 300, answer
            assert "content-length" not in headers and headers["transfer-encoding"] == "chunked"
            assert json.loads(answer)["model"] == NEW and b'"chat"' not in answer
            assert router.meter.totals[(1, "acme")].tokens_out == 40  # its usage read as it passed

    asyncio.run(go())


def test_an_endpoint_never_renamed_goes_through_untouched():
    """The usual case costs nothing: the body reaches the pod as the client sent it (the tenant's
    salt after its brace, as always), with no name to put back in the answer."""
    raw = b'{"model": "chat", "prompt": "hi", "max_tokens": 3}'
    forwarded, _, _ = pod_body(raw, json.loads(raw), "acme")
    assert forwarded.endswith(raw[1:]) and json.loads(forwarded)["model"] == "chat"
    renamed, asked, _ = pod_body(raw, json.loads(raw), "acme", SERVED)
    assert json.loads(renamed) == {**json.loads(forwarded), "model": SERVED}
    assert asked is False  # not a stream: no usage asked for


@pytest.mark.parametrize(
    "answer",
    [
        b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"chat","choices":[]}',
        b'data: {"id": "c", "model": "chat", "choices": [{"text": "chat"}]}\n\n',
    ],
    ids=["vllm-compact", "sim-spaced"],
)
def test_the_name_is_put_back_wherever_a_read_splits_it(answer):
    expected = answer.replace(b'"model":"chat"', b'"model":"assistant"').replace(
        b'"model": "chat"', b'"model": "assistant"'
    )
    assert AnswerName(SERVED, NEW).whole(answer) == expected
    for cut in range(len(answer) + 1):
        name = AnswerName(SERVED, NEW)
        assert name.feed(answer[:cut]) + name.feed(answer[cut:]) + name.end() == expected, cut


def test_only_the_model_member_with_the_served_name_is_put_back():
    text = json.dumps({"text": 'a "model": "chat" quoted', "model": "chat-2", "tools": [{"model": "chat"}]})
    # a string's quotes are escaped; another name is another; a nested member of that name is one
    assert json.loads(AnswerName(SERVED, NEW).whole(text.encode())) == {
        "text": 'a "model": "chat" quoted',
        "model": "chat-2",
        "tools": [{"model": NEW}],
    }


@pytest.mark.vllm
def test_vllm_answers_with_its_first_served_name_so_the_router_puts_the_asked_one_back():
    """The installed vLLM's own code: started with two names it takes a request for either and
    answers with the first (why pods are not restarted with both names); its answers and chunks,
    as it dumps them, read under the name asked once the router has put it back."""
    python = vllm_python_or_skip("vLLM's served names")
    code = """
import asyncio, vllm
from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry
from vllm.entrypoints.openai.models.protocol import BaseModelPath
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionResponseStreamChoice, ChatCompletionStreamResponse, DeltaMessage)
from vllm.entrypoints.openai.completion.protocol import CompletionResponse, CompletionResponseChoice
from vllm.entrypoints.serve.engine.protocol import UsageInfo
registry = OpenAIModelRegistry(None, [BaseModelPath("chat", "/m"), BaseModelPath("assistant", "/m")])
print(registry.model_name(), asyncio.run(registry.check_model("assistant")) is None)
chunk = ChatCompletionStreamResponse(id="c", created=1, model=registry.model_name(),
    choices=[ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(content='"model":"chat"'))])
print("data: " + chunk.model_dump_json(exclude_unset=True))
done = CompletionResponse(id="d", created=1, model=registry.model_name(),
    choices=[CompletionResponseChoice(index=0, text="hi")], usage=UsageInfo(prompt_tokens=1))
print(done.model_dump_json())
"""
    import subprocess

    out = subprocess.run([python, "-c", code], capture_output=True, check=True, timeout=120)
    first, chunk, done = out.stdout.decode().splitlines()[-3:]
    assert first == "chat True"  # "assistant" is served too, but the answers say "chat"
    name = AnswerName(SERVED, NEW)
    chunk_doc = json.loads(name.whole(chunk.encode())[6:])
    assert chunk_doc["model"] == NEW and chunk_doc["choices"][0]["delta"]["content"] == '"model":"chat"'
    assert json.loads(name.whole(done.encode()))["model"] == NEW
