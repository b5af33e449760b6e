"""Every response metered from what the engine produced, through the router to the real simulated
engine over HTTP, read by the official openai SDK (and by httpx where bytes are compared):

- a stream whose client did not ask for usage: the router asks for it, prices from it, and the
  client gets the engine's bytes, usage chunk dropped; asked for, it comes with ``mu``;
- a non-streamed answer carries its price in ``x-mu-cost``;
- a lying stream (``max_completion_tokens`` 1, ``max_tokens`` 200 on /v1/completions, where vLLM
  honours max_tokens) and a stream the client resets after 20 tokens count what was delivered in
  ``router_tokens_out_total`` / ``router_mu_total``, in static and in control-plane mode (tenant
  key, reservation leased from the real Redis, rows published there);
- a pod lost mid-stream costs nothing (the platform's failure), never the admission estimate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from redis.asyncio import Redis

from dataplane.router.discovery import static_table
from dataplane.router.lease_limiter import LeasedLimiter
from dataplane.router.pricing import CostModel, estimate_input_tokens, price
from dataplane.router.server import Router
from dataplane.router.validation import demand
from dataplane.wire.load_samples import EndpointSecond, load_key
from dataplane.wire.routing_table import ReservedRate, RoutedPod, RoutingTable
from tests.router.conftest import FAST, TENANT_KEY, assert_idle, running, scrape, table_doc, with_config
from tests.router.fakepod import FakePod
from tests.runtime.support import SimProcess, sim_engine

pytestmark = pytest.mark.stack  # simulated engines as subprocesses

MODEL = "chat"  # the engine's served name, the control-plane endpoint's name
COEFFS = CostModel(0.002, 0.02, 0.1)  # the static mode's and the control-plane endpoint's
PROMPT = "Tell me about the weather in the mountains"
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture(scope="module")
def engine() -> Iterator[SimProcess]:
    # time scale 4: 2.5 ms a token, slow enough for a client to read each as it comes
    with sim_engine("--profile", "tiny-test", "--time-scale", "4", "--served-model-name", MODEL) as e:
        yield e


@pytest.fixture(scope="module")
def slow_engine() -> Iterator[SimProcess]:
    # 20 ms a token: a client on a busy machine reads each as it comes, so what the router passed
    # on is what reached the client when it resets
    with sim_engine("--profile", "tiny-test", "--time-scale", "0.5", "--served-model-name", MODEL) as e:
        yield e


class Through:
    """A router in front of the engine, and what a client needs to use it."""

    def __init__(self, router: Router, key: str, meter_key: tuple[int, str], redis: Any) -> None:
        self.router, self.key, self.meter_key, self.redis = router, key, meter_key, redis
        self.url = f"http://127.0.0.1:{router.port}"
        self.clients: list[openai.AsyncOpenAI] = []

    def sdk(self, base: str | None = None, http: httpx.AsyncClient | None = None) -> openai.AsyncOpenAI:
        """The official SDK on the router (or on ``base``); closed with the router."""
        client = openai.AsyncOpenAI(
            base_url=f"{base or self.url}/v1", api_key=self.key, max_retries=0, timeout=20, http_client=http
        )
        self.clients.append(client)
        return client

    async def close(self) -> None:
        for client in self.clients:
            await client.close()

    async def totals(self) -> tuple[float, float, float]:
        """(requests, router_tokens_out_total, router_mu_total) of this endpoint, from /metrics."""
        fams = await scrape(self.router)

        def total(name: str) -> float:
            return sum(s.value for s in fams[name].samples if s.name == name + "_total")

        return total("router_requests"), total("router_tokens_out"), total("router_mu")


@contextlib.asynccontextmanager
async def through(engine: SimProcess, mode: str, config: Any = FAST) -> AsyncIterator[Through]:
    """The router in static mode (``--backends``), or in control-plane mode: a table as the control
    plane serves it (tenant key, a reservation), its lease and published rows in the real Redis."""
    if mode == "static":
        async with running([], table=static_table([engine.url], "p2c-mu", 0), config=config) as (router, _):
            t = Through(router, "unused", (0, ""), None)
            try:
                yield t
            finally:
                await t.close()
        return
    redis = Redis.from_url(REDIS_URL, socket_timeout=2)
    try:
        await redis.ping()
    except Exception as exc:  # pragma: no cover - CI starts Redis
        await redis.aclose()
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    endpoint_id = random.randrange(10**9, 2 * 10**9)  # its own Redis keys
    table = RoutingTable.from_json(  # as a router reads it from the control plane
        table_doc(
            [],
            id=endpoint_id,
            name=MODEL,
            model="sim-tiny",
            coefficients=COEFFS,
            reservation=ReservedRate(6000, best_effort_allowed=True),
            pods=(RoutedPod("sim-0", engine.url, True),),
        )
    )
    limiter = LeasedLimiter(redis, time.monotonic, prefix=f"test:lease:{endpoint_id}:")
    try:
        async with running([], table=table, config=config, limiter=limiter, redis=redis) as (router, _):
            t = Through(router, TENANT_KEY, (endpoint_id, "acme"), redis)
            try:
                yield t
            finally:
                await t.close()
    finally:
        await redis.aclose()


class Received(httpx.AsyncBaseTransport):
    """The SDK's transport, keeping every body byte that reached the client's socket: what the
    client received, read by the SDK or not yet when it closed the stream."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.body = b""

    def tokens(self) -> int:
        """Token chunks received (chunks with choices; a completions stream has no role chunk)."""
        return sum(e.startswith(b"data: {") and b'"choices": [{' in e for e in self.body.split(b"\n\n"))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        received, stream = self, response.stream
        assert isinstance(stream, httpx.AsyncByteStream)

        class Kept(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for chunk in stream:
                    received.body += chunk
                    yield chunk

            async def aclose(self) -> None:
                await stream.aclose()

        return httpx.Response(response.status_code, headers=response.headers, stream=Kept())

    async def aclose(self) -> None:
        await self.inner.aclose()


def _norm(data: bytes) -> bytes:
    return re.sub(rb'"created": ?\d+', b'"created": 0', data)  # the engine's clock second


CHAT = [{"role": "user", "content": PROMPT}]
STREAMS = {
    "completions": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 8}),
    "completions-n2-stop": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "n": 2, "stop": ["e"]}),
    "chat-n3": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "n": 3}),
    "continuous-stats-without-usage": (
        "/v1/completions",
        {"prompt": PROMPT, "max_tokens": 5, "stream_options": {"continuous_usage_stats": True}},
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(STREAMS))
def test_a_stream_without_usage_asked_is_the_engines_bytes_and_metered_from_its_usage(engine, case):
    path, extra = STREAMS[case]
    body = {"model": MODEL, "stream": True, "seed": 11, **extra}

    async def go() -> None:
        async with through(engine, "static") as t, httpx.AsyncClient(timeout=10) as http:
            rid = {"x-request-id": f"bytes-{case}"}  # the engine names the chunks after it
            direct = await http.post(engine.url + path, json=body, headers=rid)
            routed = await http.post(t.url + path, json=body, headers=rid)
            assert routed.status_code == direct.status_code == 200
            assert _norm(routed.content) == _norm(direct.content)
            assert b'"choices": []' not in routed.content  # no usage chunk: the client asked for none
            # what the engine reports for the same generation (same seed), asked directly
            asked = {**body, "stream_options": {"include_usage": True}}
            usage = json.loads(
                [e for e in (await http.post(engine.url + path, json=asked)).content.split(b"\n\n") if e][-2][
                    6:
                ]
            )["usage"]
            await assert_idle(t.router)
            s = t.router.meter.totals[t.meter_key]
            assert (s.tokens_in, s.tokens_out) == (usage["prompt_tokens"], usage["completion_tokens"])
            assert s.mu == pytest.approx(price(COEFFS, usage["prompt_tokens"], usage["completion_tokens"]))
            # the SDK reads the same chunks through the router as from the engine
            kind = "chat" if "chat" in path else "completions"

            async def chunks(client: openai.AsyncOpenAI) -> list[dict[str, Any]]:
                create = client.chat.completions.create if kind == "chat" else client.completions.create
                args = {k: v for k, v in body.items() if k not in ("model", "stream", "stream_options")}
                options = body.get("stream_options")
                stream = await create(
                    model=MODEL, stream=True, stream_options=options, extra_headers=rid, **args
                )
                return [{**c.model_dump(), "created": 0} async for c in stream]

            via_router, via_engine = await chunks(t.sdk()), await chunks(t.sdk(engine.url))
            assert via_router == via_engine and via_router
            assert all(c["usage"] is None for c in via_router)  # continuous stats need include_usage

    asyncio.run(go())


def test_usage_asked_for_comes_with_its_price_in_mu(engine):
    async def go() -> None:
        async with through(engine, "static") as t:
            for options in ({"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}):
                before = await t.totals()
                stream = await t.sdk().completions.create(
                    model=MODEL, prompt=PROMPT, max_tokens=7, stream=True, stream_options=options
                )
                chunks = [c async for c in stream]
                last = chunks[-1]
                assert last.choices == [] and last.usage is not None
                exact = price(COEFFS, last.usage.prompt_tokens, last.usage.completion_tokens)
                assert (last.usage.model_extra or {})["mu"] == pytest.approx(exact, abs=1e-6)
                # continuous usage stats: in every chunk, and only the last one has a price
                assert all(c.usage is not None for c in chunks) == ("continuous_usage_stats" in options)
                assert sum("mu" in (c.usage.model_extra or {}) for c in chunks if c.usage) == 1
                after = await t.totals()
                assert after[1] - before[1] == last.usage.completion_tokens == 7
                assert after[2] - before[2] == pytest.approx(exact)

    asyncio.run(go())


def test_a_non_streamed_answer_carries_its_price_in_x_mu_cost(engine):
    async def go() -> None:
        async with through(engine, "static") as t:
            sdk = t.sdk()
            raw = await sdk.completions.with_raw_response.create(
                model=MODEL, prompt=PROMPT, max_tokens=9, n=2
            )
            done = raw.parse()
            assert done.usage is not None
            exact = price(COEFFS, done.usage.prompt_tokens, done.usage.completion_tokens)
            assert float(raw.headers["x-mu-cost"]) == pytest.approx(exact, abs=1e-6)
            assert int(raw.headers["content-length"]) == len(raw.content)
            chat = await sdk.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=4
            )
            usage = chat.parse().usage
            assert usage is not None
            assert float(chat.headers["x-mu-cost"]) == pytest.approx(
                price(COEFFS, usage.prompt_tokens, usage.completion_tokens), abs=1e-6
            )
            # an answer the engine refuses (before any GPU work) costs nothing, said so
            with pytest.raises(openai.BadRequestError) as refused:
                await sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=-1)
            assert refused.value.response.headers["x-mu-cost"] == "0"
        # an answer larger than the router holds (its max body size) passes through, unpriced in
        # its head, and is metered all the same
        async with through(engine, "static", with_config(max_body_bytes=400)) as t:
            async with httpx.AsyncClient(timeout=10) as http:
                r = await http.post(
                    t.url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 20, "n": 2}
                )
            assert r.status_code == 200 and len(r.content) > 400 and "x-mu-cost" not in r.headers
            usage = r.json()["usage"]
            await assert_idle(t.router)
            assert t.router.meter.totals[t.meter_key].mu == pytest.approx(
                price(COEFFS, usage["prompt_tokens"], usage["completion_tokens"])
            )

    asyncio.run(go())


def test_a_passed_through_chat_answer_with_prompt_logprobs_after_its_usage_is_metered(engine):
    """Chat answers put prompt_logprobs after usage (vLLM and the sim): an answer larger than the
    router holds is searched read by read, not in its last bytes, and metered from its usage."""

    async def go() -> None:
        async with through(engine, "static", with_config(max_body_bytes=1500)) as t:  # the request fits
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": PROMPT * 30}],  # ~330 prompt tokens
                "max_tokens": 7,
                "prompt_logprobs": 1,
            }
            async with httpx.AsyncClient(timeout=10) as http:
                r = await http.post(t.url + "/v1/chat/completions", json=body)
            assert r.status_code == 200 and "x-mu-cost" not in r.headers
            after_usage = r.content[r.content.index(b'"usage"') :]
            assert len(after_usage) > 8192  # the usage is far from the end
            usage = r.json()["usage"]
            assert usage["completion_tokens"] == 7
            await assert_idle(t.router)
            s = t.router.meter.totals[t.meter_key]
            assert (s.tokens_in, s.tokens_out) == (usage["prompt_tokens"], 7)
            assert s.mu == pytest.approx(price(COEFFS, usage["prompt_tokens"], 7))

    asyncio.run(go())


async def _published_mu(t: Through, since: int) -> float:
    """MU the router published to Redis for its endpoint from second ``since`` on."""
    total = 0.0
    for second in range(since - 1, int(time.time()) + 1):
        raw = await t.redis.get(load_key(t.meter_key[0], second))
        if raw:
            total += EndpointSecond.from_redis_slots(raw).mu
    return total


@pytest.mark.parametrize("mode", ["static", "control-plane"])
def test_a_lying_stream_meters_what_the_engine_produced(engine, mode):
    async def go() -> None:
        async with through(engine, mode) as t:
            sdk = t.sdk()
            # the lie: 1 token claimed, 200 honoured by the completions API (vLLM's
            # CompletionRequest has no max_completion_tokens: it is ignored as an unknown field)
            lying = {"prompt": PROMPT, "max_tokens": 200, "stream": True}
            before = await t.totals()
            stream = await sdk.completions.create(
                model=MODEL, extra_body={"max_completion_tokens": 1}, seed=5, **lying
            )
            received = len([c async for c in stream if c.choices])
            assert received > 100  # the engine honoured max_tokens
            after = await t.totals()
            tokens_out, mu = after[1] - before[1], after[2] - before[2]
            assert abs(tokens_out - received) <= 2
            direct = await t.sdk(engine.url).completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
            assert direct.usage is not None
            assert mu == pytest.approx(price(COEFFS, direct.usage.prompt_tokens, tokens_out))
            assert mu > 2.0  # not the 0.1-odd MU of the claimed single token
            # the admission estimate was corrected to the exact price
            if mode == "control-plane":
                body = {"model": MODEL, "max_completion_tokens": 1, **lying}
                ep = t.router.endpoints[t.meter_key[0]]
                cfg = t.router.config
                need = demand(body, False, ep.spec.max_model_len, cfg.max_n, cfg.default_max_tokens)
                estimate = price(COEFFS, estimate_input_tokens(body, False), need.output_tokens)
                pending = t.router.admission.limiter._pending  # type: ignore[attr-defined]
                assert pending.get(ep.limit_key, 0.0) == pytest.approx(mu - estimate)  # none when equal

    asyncio.run(go())


@pytest.mark.parametrize("mode", ["static", "control-plane"])
def test_a_stream_the_client_resets_meters_what_was_delivered(slow_engine, mode):
    async def go() -> None:
        started = int(time.time())
        received = Received()
        async with through(slow_engine, mode) as t, httpx.AsyncClient(transport=received) as http:
            sdk = t.sdk(http=http)
            # 20 tokens read, then the connection closed
            before = await t.totals()
            stream = await sdk.completions.create(model=MODEL, prompt=PROMPT, max_tokens=200, stream=True)
            got = 0
            async for c in stream:
                got += bool(c.choices)
                if got == 20:
                    break
            await stream.close()
            await assert_idle(t.router)
            after = await t.totals()
            assert after[0] - before[0] == 1
            tokens_out, mu = after[1] - before[1], after[2] - before[2]
            # the client's socket got what the router passed on; the SDK read 20 of it (on a
            # busy machine the router may pass on a few more before the SDK hands them over)
            assert 20 <= received.tokens() < 200
            assert abs(tokens_out - received.tokens()) <= 2, (tokens_out, received.tokens())
            assert mu == pytest.approx(price(COEFFS, estimate_input_tokens({"prompt": PROMPT}), tokens_out))
            if mode == "control-plane":  # the rows the control plane reads say the same
                metered = t.router.meter.totals[t.meter_key].mu
                for _ in range(40):
                    if await _published_mu(t, started) == pytest.approx(metered):
                        break
                    await asyncio.sleep(0.1)
                assert await _published_mu(t, started) == pytest.approx(metered)

    asyncio.run(go())


def test_a_client_reset_before_the_answer_meters_the_estimate(slow_engine):
    """A non-streamed request the pod is working on (200 tokens, 4 s), its client gone before the
    answer: metered at what it was admitted for, not 0."""

    async def go() -> None:
        async with through(slow_engine, "static") as t:
            body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200}
            async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=0.5)) as http:
                with pytest.raises(httpx.ReadTimeout):  # then the client closes its connection
                    await http.post(t.url + "/v1/completions", json=body)
            await assert_idle(t.router)
            cfg = t.router.config
            need = demand(
                body, False, t.router.endpoints[0].spec.max_model_len, cfg.max_n, cfg.default_max_tokens
            )
            tokens_in = estimate_input_tokens(body, False)
            s = t.router.meter.totals[t.meter_key]
            assert (s.requests, s.tokens_in, s.tokens_out) == (1, tokens_in, need.output_tokens)
            assert s.mu == pytest.approx(price(COEFFS, tokens_in, need.output_tokens))

    asyncio.run(go())


@pytest.mark.parametrize("held", [True, False])
def test_a_2xx_answer_without_usage_meters_the_estimate(held):
    """A pod must not make an answer free by leaving its usage out (``"usage": null``), held or
    passed through."""

    async def go() -> None:
        config = with_config(max_body_bytes=4096 if held else 100)  # the answer is ~125 bytes
        async with running([await FakePod("pod-0", mode="nousage").start()], config=config) as (router, _):
            body = {"model": "m", "prompt": "x" * 40, "max_tokens": 50}
            async with httpx.AsyncClient(timeout=5) as http:
                r = await http.post(f"http://127.0.0.1:{router.port}/v1/completions", json=body)
            assert r.status_code == 200 and r.json()["usage"] is None
            assert ("x-mu-cost" in r.headers) == held
            await assert_idle(router)
            s = router.meter.totals[(0, "")]
            assert (s.tokens_in, s.tokens_out) == (10, 50)
            assert s.mu == pytest.approx(price(COEFFS, 10, 50))
            if held:
                assert float(r.headers["x-mu-cost"]) == pytest.approx(price(COEFFS, 10, 50))

    asyncio.run(go())


def test_a_pod_lost_mid_stream_costs_nothing():
    async def go() -> None:
        async with running([await FakePod("pod-0", mode="break").start()]) as (router, _):
            body = {"model": "m", "prompt": "x" * 400, "max_tokens": 500, "stream": True}
            async with httpx.AsyncClient(timeout=5) as http:
                with contextlib.suppress(httpx.HTTPError):
                    async with http.stream(
                        "POST", f"http://127.0.0.1:{router.port}/v1/completions", json=body
                    ) as r:
                        async for _ in r.aiter_bytes():
                            pass
            await assert_idle(router)
            s = router.meter.totals[(0, "")]
            # one event came, then the pod was lost: the platform's failure, not billed
            assert (s.requests, s.errors, s.tokens_in, s.tokens_out, s.mu) == (1, 1, 0, 0, 0.0)

    asyncio.run(go())
