"""A chat with an image, through the router to the simulated vision engine over real sockets, read
by the official openai SDK: priced from the engine's usage (its prompt tokens hold the image's
256 tokens, its prompt_tokens_details the cached ones and the image's), so the second identical
request, whose prompt the prefix cache holds, costs less by exactly the cached tokens' discount.
A remote image URL, a malformed data URL and a GIF made to be slow to read are 400s naming the
part, never a 500, and never reach the engine.

Worked numbers (alpha 0.002, beta 0.02, gamma 0.1, delta 0.0001 MU per image token, cached
tokens at 0.1 of alpha): "What is in it?" renders to 8 tokens, the 448 x 448 image adds 256 ->
264 prompt tokens; 8 tokens out. First: 0.002 x 264 + 0.02 x 8 + 0.1 + 0.0001 x 256 = 0.8136 MU.
Again: 256 of the 264 cached (16 whole blocks, less than all 264) -> 0.002 x (8 + 25.6) + 0.16 +
0.1 + 0.0256 = 0.3528 MU.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import openai
import pytest

from dataplane.router.pricing import CostModel
from dataplane.router.server import Router
from dataplane.wire.routing_table import ReservedRate, RoutedPod, RoutingTable
from tests.image_files import data_url, gif, image_part, png
from tests.router.conftest import TENANT_KEY, running, scrape, table_doc
from tests.runtime.support import SimProcess, sim_engine

pytestmark = pytest.mark.stack  # a simulated engine as a subprocess

MODEL = "vision"
COEFFS = CostModel(0.002, 0.02, 0.1, cached_token_factor=0.1, delta=0.0001)
QUESTION = "What is in it?"


@pytest.fixture(scope="module")
def engine() -> Iterator[SimProcess]:
    args = ("--profile", "h100-qwen2-vl-7b-vision", "--time-scale", "20", "--served-model-name", MODEL)
    with sim_engine(*args, "--enable-prefix-caching", "--enable-prompt-tokens-details") as e:
        yield e


@contextlib.asynccontextmanager
async def routed(engine: SimProcess) -> AsyncIterator[tuple[Router, openai.AsyncOpenAI]]:
    table = RoutingTable.from_json(  # as a router reads it from the control plane
        table_doc(
            [],
            id=7,
            name=MODEL,
            model=MODEL,
            coefficients=COEFFS,
            reservation=ReservedRate(6000, best_effort_allowed=True),
            pods=(RoutedPod("sim-0", engine.url, True),),
        )
    )
    async with running([], table=table) as (router, _):
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{router.port}/v1", api_key=TENANT_KEY, max_retries=0, timeout=20
        )
        try:
            yield router, client
        finally:
            await client.close()


def messages(image: dict[str, object]) -> list[dict[str, object]]:
    return [{"role": "user", "content": [{"type": "text", "text": QUESTION}, image]}]


async def mu_total(router: Router) -> float:
    fams = await scrape(router)
    return sum(s.value for s in fams["router_mu"].samples if s.name == "router_mu_total")


def test_an_image_is_priced_by_its_tokens_and_a_cached_prefix_at_its_discount(engine):
    async def go() -> None:
        async with routed(engine) as (router, client):
            body = messages(image_part(png(448, 448)))
            first = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=body, max_tokens=8
            )
            usage = first.parse().usage
            assert usage is not None and usage.prompt_tokens == 8 + 256 and usage.completion_tokens == 8
            assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 0
            assert float(first.headers["x-mu-cost"]) == pytest.approx(0.8136)
            again = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=body, max_tokens=8
            )
            details = again.parse().usage.prompt_tokens_details
            assert details is not None and details.cached_tokens == 256
            assert float(again.headers["x-mu-cost"]) == pytest.approx(0.3528)
            assert await mu_total(router) == pytest.approx(0.8136 + 0.3528)

    asyncio.run(go())


def test_a_streamed_chat_with_an_image_carries_its_price_in_the_usage_chunk(engine):
    async def go() -> None:
        async with routed(engine) as (router, client):
            body = messages(image_part(png(896, 448)))  # 32 x 16 = 512 image tokens
            stream = await client.chat.completions.create(
                model=MODEL, messages=body, max_tokens=4, stream=True, stream_options={"include_usage": True}
            )
            chunks = [chunk async for chunk in stream]
            usage = chunks[-1].usage
            assert usage is not None and usage.prompt_tokens == 8 + 512
            cached = usage.prompt_tokens_details.cached_tokens  # another test's prompt may share blocks
            expected = COEFFS.cost(8 + 512, 4, cached, 512)
            assert usage.model_extra["mu"] == pytest.approx(expected, abs=1e-6)
            assert await mu_total(router) == pytest.approx(expected, abs=1e-6)
            # without a cache hit: 0.002 x 520 + 0.02 x 4 + 0.1 + 0.0001 x 512 = 1.2712 MU
            assert COEFFS.cost(520, 4, 0, 512) == pytest.approx(1.2712)

    asyncio.run(go())


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("https://example.com/cat.png", "not 'https' (the router does not fetch images)"),
        ("data:image/png;base64,!!!!", "not valid base64"),
        (data_url(b"GIF89a"), "ends before its header"),
        # made to be slow to read: 510 empty extensions before the frame, past its bound (81 blocks)
        (
            data_url(gif(1, 1, empty_extensions=510), "image/gif"),
            "may have at most 81 blocks before its frame",
        ),
    ],
)
def test_a_remote_or_malformed_image_is_a_400_naming_the_part(engine, url, said):
    async def go() -> None:
        async with routed(engine) as (router, client):
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(
                    model=MODEL,
                    messages=messages({"type": "image_url", "image_url": {"url": url}}),
                    max_tokens=4,
                )
            error = caught.value.body
            assert isinstance(error, dict) and error["param"] == "messages[0].content[1].image_url.url"
            assert said in error["message"]
            assert await mu_total(router) == 0  # refused before any pod: nothing to meter

    asyncio.run(go())
