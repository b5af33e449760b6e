"""1,000 mixed requests through one router to real simulated engines: the MU metered adds up to
the engine's own usage priced by the endpoint's coefficients, within 0.5 %.

The mix (fixed seed): completions and chat, streamed and not, streams with and without
``include_usage`` and with ``continuous_usage_stats``, ``n`` up to 3, stop sequences, and streams
the client resets after a few tokens. Resets go to a second tenant's endpoint on an engine of its
own, so each engine's counters (``vllm:generation_tokens_total``) are the truth for one meter key:
an engine keeps generating for a moment after its client left, and under load the client reads
what the router passed on late, so what the resets cost is bounded: at least the tokens their
clients read, at most what their engine generated (test_exact_metering holds one reset stream to
within 2 tokens of what its client read).
"""

from __future__ import annotations

import asyncio
import json
import random
import urllib.request
from typing import Any

import pytest

from dataplane.router.pricing import CostModel, estimate_input_tokens
from dataplane.router.upstream import fetch
from dataplane.runtime.metrics import sample_sum
from dataplane.wire.routing_table import ReservedRate, RoutedEndpoint, RoutedPod, RoutingTable
from tests.router.conftest import OTHER_KEY, TENANT_KEY, assert_idle, running, sha, with_config
from tests.runtime.support import sim_engine

pytestmark = pytest.mark.stack  # simulated engines as subprocesses

COEFFS = CostModel(0.002, 0.02, 0.1)
REQUESTS = 1000
RESETS = 40  # of the REQUESTS
PROMPTS = [
    "Tell me about the weather in the mountains",
    "Write a haiku about routers",
    "List three prime numbers and explain why",
    "hi",
]
JSON = {"content-type": "application/json"}
STOPS = [["e"], ["the", "a"], ["\n"]]


def endpoint(id_: int, tenant: str, url: str) -> RoutedEndpoint:
    return RoutedEndpoint(
        id=id_,
        tenant=tenant,
        name="chat",
        model="sim-tiny",
        policy="p2c-mu",
        coefficients=COEFFS,
        mu_per_replica_minute=100,
        target_concurrency=64,
        scale_to_zero_enabled=False,
        reservation=ReservedRate(10**9, best_effort_allowed=True),
        pods=(RoutedPod(f"sim-{id_}", url, True),),
    )


def generated(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        value = sample_sum(r.read().decode(), "vllm:generation_tokens_total")
    assert value is not None
    return value


def mix(rng: random.Random) -> list[tuple[str, dict[str, Any], int]]:
    """(path, body, tokens to read before resetting; 0: read to the end) per request."""
    out = []
    resets = set(rng.sample(range(REQUESTS), RESETS))
    for i in range(REQUESTS):
        chat = rng.random() < 0.5
        prompt = rng.randrange(len(PROMPTS))
        body: dict[str, Any] = {"model": "chat", "max_tokens": rng.randint(1, 12), "seed": i}
        if chat:
            body["messages"] = [{"role": "user", "content": PROMPTS[prompt]}]
        else:
            body["prompt"] = PROMPTS[prompt]
        if rng.random() < 0.3:
            body["n"] = rng.randint(2, 3)
        if rng.random() < 0.3:
            body["stop"] = rng.choice(STOPS)
        if i in resets:
            body.update(stream=True, max_tokens=30, n=1)
            body.pop("stop", None)
            if rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
            out.append(("/v1/chat/completions" if chat else "/v1/completions", body, rng.randint(1, 5)))
            continue
        kind = rng.random()
        if kind < 0.65:
            body["stream"] = True
            if kind < 0.25:
                body["stream_options"] = {"include_usage": True}
            elif kind < 0.35:
                body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        out.append(("/v1/chat/completions" if chat else "/v1/completions", body, 0))
    return out


def test_a_replay_of_1000_mixed_requests_meters_the_engines_usage():
    with (
        sim_engine("--profile", "tiny-test", "--time-scale", "50", "--served-model-name", "chat") as main,
        sim_engine("--profile", "tiny-test", "--time-scale", "2", "--served-model-name", "chat") as slow,
    ):
        asyncio.run(replay(main.url, slow.url))


async def read_then_reset(port: int, path: str, body: dict[str, Any], key: str, tokens: int) -> int:
    """POST a stream, read ``tokens`` token chunks of it, then reset the connection: the tokens
    read (fewer when the stream ends first)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    writer.write(
        b"POST %s HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (path.encode(), key.encode(), len(data), data)
    )
    got, seen = 0, b""
    try:
        while got < tokens and b"[DONE]" not in seen:
            part = await asyncio.wait_for(reader.read(65536), 10)
            if not part:
                break
            seen += part
            events = [e for e in seen.split(b"\n\n") if b'"choices": [{' in e and b'"role"' not in e]
            got = min(len(events), tokens)
    finally:
        writer.transport.abort()
    return got


async def replay(main_url: str, slow_url: str) -> None:
    requests = mix(random.Random(19))
    table = RoutingTable(
        "v1",
        (endpoint(1, "acme", main_url), endpoint(2, "globex", slow_url)),
        {sha(TENANT_KEY): "acme", sha(OTHER_KEY): "globex"},
    )
    cp_table = RoutingTable.from_json(table.to_json())  # as a router reads it from the control plane
    async with running([], table=cp_table, config=with_config(queue_wait_s=30)) as (router, _):
        base = f"http://127.0.0.1:{router.port}"
        # the engine's prompt tokens of each prompt, as its usage reports them (asked directly)
        prompt_tokens: dict[tuple[str, int], int] = {}
        for path in ("/v1/completions", "/v1/chat/completions"):
            for i, text in enumerate(PROMPTS):
                asked = (
                    {"messages": [{"role": "user", "content": text}]} if "chat" in path else {"prompt": text}
                )
                body: dict[str, Any] = {"model": "chat", "max_tokens": 1, **asked}
                _, _, answer = await fetch(main_url + path, "POST", JSON, json.dumps(body).encode())
                prompt_tokens[(path, i)] = json.loads(answer)["usage"]["prompt_tokens"]
        main_before, slow_before = generated(main_url), generated(slow_url)
        received_by_resets = 0
        expected_fixed = 0.0  # alpha x prompt tokens + gamma, per request read to its end
        reset_fixed = 0.0  # the same for resets, at the router's estimate of the input
        todo = list(reversed(requests))

        async def worker() -> None:
            nonlocal received_by_resets, expected_fixed, reset_fixed
            while todo:
                path, body, reset_after = todo.pop()
                text = body.get("prompt") or body["messages"][0]["content"]
                if reset_after:
                    got = await read_then_reset(router.port, path, body, OTHER_KEY, reset_after)
                    received_by_resets += got
                    reset_fixed += COEFFS.alpha * estimate_input_tokens(body) + COEFFS.gamma
                    continue
                headers = {**JSON, "authorization": f"Bearer {TENANT_KEY}"}
                status, _, answer = await fetch(base + path, "POST", headers, json.dumps(body).encode(), 30)
                assert status == 200, answer
                assert not body.get("stream") or answer.endswith(b"data: [DONE]\n\n"), answer
                expected_fixed += COEFFS.alpha * prompt_tokens[(path, PROMPTS.index(text))] + COEFFS.gamma

        await asyncio.gather(*(worker() for _ in range(24)))
        await assert_idle(router, timeout=5)
        served = router.meter.totals[(1, "acme")]
        engine_tokens = generated(main_url) - main_before
        expected = expected_fixed + COEFFS.beta * engine_tokens
        assert served.requests == REQUESTS - RESETS and served.errors == 0
        assert abs(served.mu - expected) <= 0.005 * expected, (served.mu, expected)
        assert abs(served.tokens_out - engine_tokens) <= 0.005 * engine_tokens, served.tokens_out
        # resets: at least what the clients read, at most what their engine generated
        cut = router.meter.totals[(2, "globex")]
        assert cut.requests == RESETS
        assert received_by_resets <= cut.tokens_out <= generated(slow_url) - slow_before
        assert abs(cut.mu - (reset_fixed + COEFFS.beta * cut.tokens_out)) < 1e-6 * cut.mu
