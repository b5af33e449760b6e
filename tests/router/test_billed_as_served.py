"""The router bills what was served, through the router to the real simulated engine over HTTP:

- a prompt past the deployment's context is refused by the router as the engine refuses it (the
  same 400 body, naming the deployment's context) where it surely is, and by the engine where
  only it can tell; either way at no charge (no ``x-mu-cost``, or 0);
- a pod's 404 (a model name it does not serve), 5xx, an error event in its stream: 0 MU;
- a stream cut before its usage chunk costs its prompt's real size: the engine's count from the
  first chunk (the router asks for continuous usage stats), else the estimate from its UTF-8
  bytes, never a quarter of it for emoji or other non-ASCII text;
- a chat's estimate counts what the template renders: names, tool calls, tool definitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from dataplane.router.discovery import static_table
from dataplane.router.pricing import CostModel, estimate_input_tokens
from dataplane.router.server import Router
from dataplane.wire.routing_table import ReservedRate, RoutedPod, RoutingTable
from tests.router.conftest import TENANT_KEY, assert_idle, cp_table, running, table_doc, with_config
from tests.router.fakepod import FakePod
from tests.runtime.support import SimProcess, sim_engine

pytestmark = pytest.mark.stack  # simulated engines as subprocesses

MODEL = "chat"  # the engines' served name, the control-plane endpoint's name
COEFFS = CostModel(0.002, 0.02, 0.1)
CTX = 512  # tiny-test's context
EMOJI = "\U0001f600"  # 4 UTF-8 bytes: one token of the simulated engine
HEADERS = {"authorization": f"Bearer {TENANT_KEY}"}


@pytest.fixture(scope="module")
def tiny() -> Iterator[SimProcess]:
    with sim_engine("--profile", "tiny-test", "--time-scale", "100", "--served-model-name", MODEL) as e:
        yield e


@pytest.fixture(scope="module")
def big() -> Iterator[SimProcess]:
    # a context of 8,192 tokens; 6 ms a token: a stream is cut long before it ends
    with sim_engine("--profile", "h100-llama-8b", "--time-scale", "1", "--served-model-name", MODEL) as e:
        yield e


@contextlib.asynccontextmanager
async def routed(pod_url: str, **endpoint: Any) -> AsyncIterator[Router]:
    """The router in control-plane mode in front of one pod: the endpoint "chat" of tenant acme
    as the control plane serves it (the deployment's context, its tokenizer's bytes a token)."""
    doc = table_doc(
        [],
        name=MODEL,
        coefficients=COEFFS,
        reservation=ReservedRate(6000, best_effort_allowed=True),
        pods=(RoutedPod("sim-0", pod_url, True),),
        **endpoint,
    )
    async with running([], table=RoutingTable.from_json(doc)) as (router, _):
        yield router


def billed(router: Router, key: tuple[int, str] = (1, "acme")) -> tuple[int, int, int, float]:
    s = router.meter.totals[key]
    return s.requests, s.tokens_in, s.tokens_out, s.mu


OVER = {
    "text": ("/v1/completions", {"prompt": "x" * (4 * CTX + 4), "max_tokens": 4}),
    "emoji": ("/v1/completions", {"prompt": EMOJI * (CTX + 1), "max_tokens": 4}),
    "batch": ("/v1/completions", {"prompt": ["hi", "\u00e9" * (2 * CTX + 2)], "max_tokens": 4}),
    "token-ids": ("/v1/completions", {"prompt": [7] * (CTX + 88), "max_tokens": 4}),
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\u4e2d" * 700}]}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(OVER))
def test_a_prompt_surely_past_the_context_is_refused_by_the_router_as_the_engine_refuses_it(tiny, case):
    path, body = OVER[case]
    body = {"model": MODEL, **body}

    async def go() -> None:
        async with routed(tiny.url, max_model_len=CTX, max_token_bytes=4) as router:
            async with httpx.AsyncClient(timeout=10) as http:
                direct = await http.post(tiny.url + path, json=body)
                r = await http.post(f"http://127.0.0.1:{router.port}{path}", json=body, headers=HEADERS)
            assert r.status_code == direct.status_code == 400
            assert r.json() == direct.json()  # vLLM's body: type, param, code and message
            assert f"maximum context length is {CTX} tokens" in r.json()["error"]["message"]
            assert "x-mu-cost" not in r.headers and "x-pod" not in r.headers  # never reached a pod
            await assert_idle(router)
            assert (1, "acme") not in router.meter.totals or billed(router)[1:] == (0, 0, 0.0)

    asyncio.run(go())


@pytest.mark.parametrize(
    "case, known",
    [
        # the contents are 510 tokens at the fewest; the template's 4 take it past 512
        ("template", 4),
        # 4,000 bytes: the router does not know the tokenizer, the engine counts 1,000 tokens
        ("unknown-tokenizer", 0),
    ],
)
def test_a_prompt_only_the_engine_can_tell_is_past_the_context_costs_nothing(tiny, case, known):
    content = "y" * (4 * (CTX - 2)) if case == "template" else "z" * 4000
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4}

    async def go() -> None:
        async with routed(tiny.url, max_model_len=CTX, max_token_bytes=known) as router:
            async with httpx.AsyncClient(timeout=10) as http:
                r = await http.post(
                    f"http://127.0.0.1:{router.port}/v1/chat/completions", json=body, headers=HEADERS
                )
            assert r.status_code == 400 and r.headers["x-pod"] == "sim-0"  # the engine's refusal
            assert f"maximum context length is {CTX} tokens" in r.json()["error"]["message"]
            assert float(r.headers["x-mu-cost"]) == 0
            await assert_idle(router)
            assert billed(router) == (1, 0, 0, 0.0)
            # the admission estimate is handed back whole to the reservation
            pending = router.admission.limiter._pending  # type: ignore[attr-defined]
            estimate = COEFFS.cost(estimate_input_tokens(body, True), 4)
            assert pending[router.endpoints[1].limit_key] == pytest.approx(-estimate)

    asyncio.run(go())


@pytest.mark.parametrize("path, body", [OVER["token-ids"], OVER["chat"]], ids=["completions", "chat"])
def test_a_prompt_the_engine_truncates_is_not_refused_for_its_length(tiny, path, body):
    """vLLM cuts a prompt to ``truncate_prompt_tokens`` before it measures it: the router never
    refuses what vLLM accepts, so such a request goes to the engine, however long its prompt."""
    body = {"model": MODEL, **body, "truncate_prompt_tokens": 16}

    async def go() -> None:
        async with routed(tiny.url, max_model_len=CTX, max_token_bytes=4) as router:
            async with httpx.AsyncClient(timeout=10) as http:
                r = await http.post(f"http://127.0.0.1:{router.port}{path}", json=body, headers=HEADERS)
            assert r.headers["x-pod"] == "sim-0", r.text  # the engine's to answer
            await assert_idle(router)

    asyncio.run(go())


def test_answers_that_fail_cost_nothing(tiny):
    """A pod's 404 for a model name it does not serve (the platform's doing), its 5xx, its 4xx,
    and a stream the engine refuses after its 200 (an error event): 0 MU."""

    async def go() -> None:
        async with running([], table=static_table([tiny.url], "p2c-mu", 0)) as (router, _):
            url = f"http://127.0.0.1:{router.port}"
            async with httpx.AsyncClient(timeout=10) as http:
                missing = await http.post(
                    url + "/v1/completions", json={"model": "renamed", "prompt": "x" * 400}
                )
                assert missing.status_code == 404 and "does not exist" in missing.json()["error"]["message"]
                assert float(missing.headers["x-mu-cost"]) == 0
                missing = await http.post(
                    url + "/v1/completions", json={"model": "renamed", "prompt": "hi", "stream": True}
                )
                assert missing.status_code == 404
                refused = await http.post(
                    url + "/v1/completions",
                    json={
                        "model": MODEL,
                        "prompt": "x" * 400,
                        "max_tokens": 5,
                        "stream": True,
                        "logprobs": 21,
                    },
                )
                assert refused.status_code == 200 and b'data: {"error"' in refused.content
            await assert_idle(router)
            assert billed(router, (0, "")) == (3, 0, 0, 0.0)
        for mode, status in (("error", 500), ("refuse", 400)):
            async with running([await FakePod("pod-0", mode=mode).start()]) as (router, _):
                async with httpx.AsyncClient(timeout=10) as http:
                    r = await http.post(
                        f"http://127.0.0.1:{router.port}/v1/completions",
                        json={"model": "m", "prompt": "x" * 400},
                    )
                assert r.status_code == status and float(r.headers["x-mu-cost"]) == 0
                await assert_idle(router)
                assert billed(router, (0, ""))[1:] == (0, 0, 0.0)

    asyncio.run(go())


async def cut_after_first_chunk(router: Router, path: str, body: dict[str, Any]) -> bytes:
    """POST a stream, read up to its first whole event, close the connection."""
    got = b""
    async with httpx.AsyncClient(timeout=10) as http:
        async with http.stream("POST", f"http://127.0.0.1:{router.port}{path}", json=body) as r:
            assert r.status_code == 200
            async for data in r.aiter_raw():
                got += data
                if b"\n\n" in got:
                    break
    await assert_idle(router)
    return got


async def engine_count(engine: SimProcess, body: dict[str, Any]) -> int:
    """The engine's own count of a request's prompt (POST /tokenize)."""
    keep = {k: body[k] for k in ("prompt", "messages") if k in body}
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(engine.url + "/tokenize", json={"model": MODEL, **keep})
    return int(r.json()["count"])


N = 8000  # bytes of emoji: 2,000 characters, 2,000 engine tokens
CUT = {  # path, body, the prompt's bytes
    "completions": ("/v1/completions", {"prompt": EMOJI * (N // 4)}, N),
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": EMOJI * (N // 4)}]}, N),
    # parts the engine joins with newlines: 2,499 bytes to the engine, 2,000 to the estimate
    "chat-parts": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": EMOJI}] * 500}]},
        2000,
    ),
    "usage-asked": (
        "/v1/completions",
        {"prompt": EMOJI * (N // 4), "stream_options": {"include_usage": True}},
        N,
    ),
    "every-chunk-asked": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": EMOJI * (N // 4)}],
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
        N,
    ),
}


@pytest.mark.parametrize("case", list(CUT))
def test_a_stream_cut_after_its_first_chunk_costs_its_prompts_real_size(big, case):
    """The contract: a streamed prompt of N bytes cut after its first chunk is metered at no less
    than 0.95 x ceil(N / 4) input tokens; here exactly the engine's count, which the router reads
    from the first chunk (above its estimate where the engine counts more)."""
    path, extra, size = CUT[case]
    body = {"model": MODEL, "stream": True, "max_tokens": 1000, **extra}

    async def go() -> None:
        async with running([], table=static_table([big.url], "p2c-mu", 0)) as (router, _):
            first = await cut_after_first_chunk(router, path, body)
            assert b"data: {" in first
            assert (b'"usage"' in first) == (case == "every-chunk-asked")  # only where the client asked
            requests, tokens_in, _, mu = billed(router, (0, ""))
            assert requests == 1 and tokens_in >= 0.95 * math.ceil(size / 4) and mu > 0
            assert tokens_in == await engine_count(big, body)
            if case == "chat-parts":
                assert tokens_in > estimate_input_tokens(body, True) + 100

    asyncio.run(go())


def test_without_the_engines_count_a_cut_stream_costs_its_byte_estimate():
    """A pod that sends no usage before its last chunk: the estimate from the prompt's UTF-8
    bytes (2,000 emoji: 2,000 tokens, not the 500 their characters would say)."""

    async def go() -> None:
        pod = await FakePod("pod-0", mode="stream", chunks=50, delay_s=0.05).start()
        async with running([pod], config=with_config(gave_up_after_silence_s=5)) as (router, _):
            body = {"model": "m", "prompt": EMOJI * 2000, "max_tokens": 100, "stream": True}
            await cut_after_first_chunk(router, "/v1/completions", body)
            requests, tokens_in, tokens_out, _ = billed(router, (0, ""))
            assert (requests, tokens_in, tokens_out) == (1, 2000, 1)

    asyncio.run(go())


def test_a_chats_estimate_counts_the_names_tool_calls_and_tools_it_renders(big):
    """A chat request whose client walks away before its answer is metered at its estimate:
    every field the template renders, in UTF-8 bytes (a tool definition of 4,000 bytes: 1,000
    tokens more than its messages alone)."""
    tools = [
        {"type": "function", "function": {"name": "lookup", "description": "\u00e9" * 2000, "parameters": {}}}
    ]
    messages = [
        {"role": "user", "content": "weather?", "name": "n" * 400},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "lookup", "arguments": json.dumps({"q": EMOJI * 100}, ensure_ascii=False)}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]  # fmt: skip
    body = {"model": MODEL, "messages": messages, "tools": tools, "max_tokens": 500}

    async def go() -> None:
        async with running([], table=static_table([big.url], "p2c-mu", 0)) as (router, _):
            async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=0.3)) as http:
                with pytest.raises(httpx.ReadTimeout):  # then the client closes its connection
                    await http.post(f"http://127.0.0.1:{router.port}/v1/chat/completions", json=body)
            await assert_idle(router)
            _, tokens_in, tokens_out, _ = billed(router, (0, ""))
            assert (tokens_in, tokens_out) == (estimate_input_tokens(body, True), 500)
            alone = estimate_input_tokens({"messages": messages}, True)
            assert tokens_in >= alone + 1000 and alone >= (400 + 400) // 4  # the name, the arguments

    asyncio.run(go())


def test_a_stream_its_tenant_deleted_the_endpoint_under_is_billed_what_it_was_sent():
    """A pod lost mid-stream is the platform's failure (0 MU) unless its endpoint is gone from
    the table: the tenant deleted it, and its pods stop with the streams they serve. What was
    sent is billed, as when the client cuts its stream (it was free: a tenant could take a
    long generation and delete its endpoint under it), and it is no error."""

    async def go() -> None:
        # one event, then the connection is dropped half a second later: the pod stopped
        pod = await FakePod("pod-0", mode="break", delay_s=0.5).start()
        async with running([pod], table=cp_table()) as (router, _):
            url = f"http://127.0.0.1:{router.port}/v1/completions"
            body = {"model": "chat", "prompt": EMOJI * 100, "max_tokens": 50, "stream": True}
            async with httpx.AsyncClient(timeout=10) as http:
                async with http.stream("POST", url, json=body, headers=HEADERS) as r:
                    chunks = r.aiter_raw()
                    assert b"data: {" in await anext(chunks)
                    router.apply(RoutingTable.versioned((), router.table.api_keys))  # deleted
                    with pytest.raises(httpx.RemoteProtocolError):  # the pod went with it
                        async for _ in chunks:
                            pass
            await assert_idle(router)
            s = router.meter.totals[(1, "acme")]
            assert (s.requests, s.errors, s.tokens_in, s.tokens_out) == (1, 0, 100, 1)
            assert s.mu == pytest.approx(COEFFS.cost(100, 1))
        await pod.stop()

    asyncio.run(go())
