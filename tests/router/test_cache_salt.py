"""Each tenant's own prefix cache: two tenants' endpoints on one simulated engine (prefix caching
and prompt_tokens_details on, as vLLM's flags), through the router over real sockets. A prompt
tenant acme sent is cached for acme (its second send reports the cached tokens) and never for
globex, whatever ``cache_salt`` globex sends; a ``cache_salt`` vLLM would refuse is a 400 naming
it, from the router, before any pod. The rewritten bodies themselves: ``test_pod_body_salt``.

Worked numbers (block 16): a prompt of 24 distinct words and a 4-word tag is ~200 tokens; its
second send finds every whole block but the one holding the last token cached:
(prompt_tokens - 1) // 16 x 16.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from dataplane.router.cache_salt import tenant_salt
from dataplane.router.pricing import CostModel
from dataplane.router.server import Router
from dataplane.wire.routing_table import ReservedRate, RoutedEndpoint, RoutedPod, RoutingTable
from tests.router.conftest import OTHER_KEY, TENANT_KEY, call, error_of, running, scrape, sha
from tests.runtime.support import SimProcess, sim_engine

pytestmark = pytest.mark.stack  # a simulated engine as a subprocess

MODEL = "m"


@pytest.fixture(scope="module")
def engine() -> Iterator[SimProcess]:
    args = ("--profile", "h100-llama-8b", "--time-scale", "50", "--served-model-name", MODEL)
    with sim_engine(*args, "--enable-prefix-caching", "--enable-prompt-tokens-details") as e:
        yield e


def endpoint(id: int, tenant: str, url: str) -> RoutedEndpoint:
    return RoutedEndpoint(
        id=id,
        tenant=tenant,
        name=MODEL,
        model=MODEL,
        policy="p2c-mu",
        coefficients=CostModel(0.002, 0.02, 0.1, cached_token_factor=0.1),
        mu_per_replica_minute=100,
        target_concurrency=8,
        scale_to_zero_enabled=False,
        reservation=ReservedRate(6000, best_effort_allowed=True),
        pods=(RoutedPod("sim-0", url, True),),  # one pod, both tenants': one prefix cache
    )


@asynccontextmanager
async def routed(engine: SimProcess) -> AsyncIterator[Router]:
    eps = (endpoint(1, "acme", engine.url), endpoint(2, "globex", engine.url))
    keys = {sha(TENANT_KEY): "acme", sha(OTHER_KEY): "globex"}
    table = RoutingTable.from_json(RoutingTable("v1", eps, keys).to_json())
    async with running([], table=table) as (router, _):
        yield router


def long_prompt() -> str:
    """~200 tokens that no other test's prompt starts with (a fresh first block)."""
    return f"{uuid.uuid4().hex} " + " ".join(f"word{i} and some more text" for i in range(24))


async def send(router: Router, key: str, **body: Any) -> tuple[int, dict[str, Any]]:
    status, _, raw = await call(router, body={"model": MODEL, "max_tokens": 2, **body}, key=key, timeout=20)
    return status, json.loads(raw)


async def cached(router: Router, key: str, prompt: str, **body: Any) -> int:
    """The cached prompt tokens the engine reports for this completion."""
    status, doc = await send(router, key, prompt=prompt, **body)
    assert status == 200, doc
    return int(doc["usage"]["prompt_tokens_details"]["cached_tokens"])


def whole_blocks(prompt_tokens: int) -> int:
    return (prompt_tokens - 1) // 16 * 16


def test_a_prompt_another_tenant_sent_is_not_cached_for_this_one(engine):
    async def go() -> None:
        async with routed(engine) as router:
            prompt = long_prompt()
            status, first = await send(router, TENANT_KEY, prompt=prompt)
            assert status == 200 and first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            tokens = first["usage"]["prompt_tokens"]
            assert tokens > 150
            assert await cached(router, OTHER_KEY, prompt) == 0  # globex: acme's blocks are not its
            assert await cached(router, TENANT_KEY, prompt) == whole_blocks(tokens)  # acme's own
            assert await cached(router, OTHER_KEY, prompt) == whole_blocks(tokens)  # globex's own now
            # a chat too: the same isolation on /v1/chat/completions
            chat = [{"role": "user", "content": long_prompt()}]
            status, _, raw = await call(
                router,
                "/v1/chat/completions",
                {"model": MODEL, "messages": chat, "max_tokens": 2},
                TENANT_KEY,
            )
            assert status == 200, raw
            status, _, raw = await call(
                router, "/v1/chat/completions", {"model": MODEL, "messages": chat, "max_tokens": 2}, OTHER_KEY
            )
            assert status == 200 and json.loads(raw)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    asyncio.run(go())


def test_a_stream_is_salted_with_its_tenant_too(engine):
    """A stream's body gets include_usage and the salt as bytes: acme's stream fills acme's cache."""

    async def go() -> None:
        async with routed(engine) as router:
            prompt = long_prompt()
            status, _, raw = await call(
                router,
                body={"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": True},
                key=TENANT_KEY,
            )
            assert status == 200 and raw.rstrip().endswith(b"data: [DONE]"), raw
            assert await cached(router, OTHER_KEY, prompt) == 0
            status, again = await send(router, TENANT_KEY, prompt=prompt)
            assert status == 200, again
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == whole_blocks(
                again["usage"]["prompt_tokens"]
            )

    asyncio.run(go())


def test_no_client_cache_salt_reaches_another_tenants_cache(engine):
    async def go() -> None:
        async with routed(engine) as router:
            prompt = long_prompt()
            assert await cached(router, TENANT_KEY, prompt) == 0
            # acme's own salt, a salt acme might have chosen, null: none is acme's cache
            for salt in (tenant_salt("acme"), "shared-by-both", None):
                assert await cached(router, OTHER_KEY, prompt, cache_salt=salt) == 0
            # both tenants sending one client salt still get a cache each
            assert await cached(router, TENANT_KEY, prompt, cache_salt="mine") == 0  # not acme's unsalted
            assert await cached(router, OTHER_KEY, prompt, cache_salt="mine") == 0
            status, again = await send(router, OTHER_KEY, prompt=prompt, cache_salt="mine")
            assert status == 200, again
            tokens = again["usage"]["prompt_tokens"]
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == whole_blocks(tokens)
            # null is no client salt: the tenant's own cache
            assert await cached(router, TENANT_KEY, prompt, cache_salt=None) == whole_blocks(tokens)

    asyncio.run(go())


@pytest.mark.parametrize(
    ("salt", "said"),
    [
        (5, "must be a non-empty string"),
        (["a"], "must be a non-empty string"),
        ("", "must be a non-empty string"),
        ("x" * 129, "at most 128 characters"),
        ("a/b", "must not contain"),
        ("tenant@acme", "must not contain"),
    ],
)
def test_a_cache_salt_the_engine_refuses_is_a_400_naming_it(engine, salt, said):
    async def go() -> None:
        async with routed(engine) as router:
            for path, body in (
                ("/v1/completions", {"prompt": "hi"}),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
            ):
                status, headers, raw = await call(
                    router, path, {"model": MODEL, "max_tokens": 2, "cache_salt": salt, **body}, TENANT_KEY
                )
                error = error_of(raw)
                assert status == 400 and error["param"] == "cache_salt", raw
                assert "x-pod" not in headers  # the router's answer (a pod's would name it)
                assert said in error["message"]
            fams = await scrape(router)  # refused before any pod: nothing metered
            assert sum(s.value for s in fams["router_mu"].samples if s.name == "router_mu_total") == 0

    asyncio.run(go())


def test_the_engine_refuses_the_same_salts(engine):
    """The rule the router applies is the engine's: the simulated engine (vLLM's copy) says 400."""

    async def go() -> None:
        from dataplane.router.upstream import fetch

        for salt, status in (
            (5, 400),
            ("", 400),
            ("x" * 129, 400),
            ("a/b", 400),
            ("x" * 128, 200),
            (None, 200),
        ):
            body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1, "cache_salt": salt}).encode()
            got, _, raw = await fetch(
                f"{engine.url}/v1/completions", "POST", {"content-type": "application/json"}, body, 10
            )
            assert got == status, raw
            if status == 400:
                assert json.loads(raw)["error"]["param"] == "cache_salt"

    asyncio.run(go())
