"""The official openai SDK, sync and async, through a real router to a real simulated engine, in
static mode (`--backends`) and in control-plane mode (a live control plane, tenant keys): what
a user of the SDK does, and what the SDK makes of our answers. The router's error counter stays
0 after clean requests."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from openai.types import Model
from prometheus_client.parser import text_string_to_metric_families

from controlplane.endpoints.models import Pod
from controlplane.selling import sell
from controlplane.tenants.models import ApiKey
from tests.runtime.support import router_process as router
from tests.runtime.support import sim_engine

pytestmark = pytest.mark.stack  # an engine and routers as subprocesses

PROMPT = "Tell me about the weather in the mountains"


def errors_total(base: str) -> float:
    """router_errors_total summed over its series, from the router's own scrape."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        text = response.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return sum(s.value for s in families["router_errors"].samples if s.name == "router_errors_total")


@pytest.fixture(scope="module")
def static_router() -> Iterator[str]:
    with (
        sim_engine("--profile", "tiny-test", "--time-scale", "20") as engine,
        router("--backends", engine.url) as base,
    ):
        yield base


@pytest.fixture
def sync_client(static_router: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{static_router}/v1", api_key="unused", max_retries=0, timeout=30)


def model_of(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_models_list_validates_against_the_sdk_types(sync_client):
    models = sync_client.models.list().data
    assert models
    for m in models:
        Model.model_validate(m.model_dump())  # id, created, object, owned_by


def test_completions_and_chat_answer_with_usage(sync_client, static_router):
    model = model_of(sync_client)
    completion = sync_client.completions.create(model=model, prompt=PROMPT, max_tokens=6)
    assert completion.choices[0].text and completion.usage.completion_tokens == 6
    chat = sync_client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=5
    )
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 5
    assert errors_total(static_router) == 0


def test_a_stream_iterates_to_its_end_with_the_usage_asked_for(sync_client, static_router):
    model = model_of(sync_client)
    chunks = list(
        sync_client.completions.create(
            model=model, prompt=PROMPT, max_tokens=8, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    chat = list(
        sync_client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=4, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chat if c.choices)
    assert errors_total(static_router) == 0


def test_a_streamed_response_read_by_lines_ends_with_done(sync_client, static_router):
    model = model_of(sync_client)
    with sync_client.completions.with_streaming_response.create(
        model=model, prompt=PROMPT, max_tokens=5, stream=True
    ) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[0].startswith("data: {") and lines[-1] == "data: [DONE]"
    assert errors_total(static_router) == 0


def test_n_and_stop_come_back_as_the_engine_honours_them(sync_client):
    model = model_of(sync_client)
    several = sync_client.completions.create(model=model, prompt=PROMPT, max_tokens=4, n=2)
    assert sorted(c.index for c in several.choices) == [0, 1]
    # The same seed gives the same text (vLLM's sampling, and the simulated engine's).
    free = sync_client.completions.create(model=model, prompt=PROMPT, max_tokens=12, seed=7).choices[0].text
    stop = free.split()[2]  # a word the engine will write
    stopped = sync_client.completions.create(model=model, prompt=PROMPT, max_tokens=12, seed=7, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop" and stop not in stopped.choices[0].text


def test_the_async_client_streams_too(static_router):
    async def go() -> tuple[str, int]:
        client = openai.AsyncOpenAI(base_url=f"{static_router}/v1", api_key="unused", max_retries=0)
        model = (await client.models.list()).data[0].id
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, tokens = "", 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        await client.close()
        return text, tokens

    text, tokens = asyncio.run(go())
    assert text and tokens == 6
    assert errors_total(static_router) == 0


# --- control-plane mode: tenant keys, endpoints, reservations


@pytest.mark.django_db(transaction=True)
def test_the_sdk_gets_openai_errors_from_a_control_plane_router(live_server, owner, other, make_endpoint):
    chat = make_endpoint(owner, "chat")
    # 10 MU/min, no best effort: a burst of 10 s is 1.7 MU, so the small requests below fit and
    # 400-token ones (1.6 MU each) are soon throttled.
    sell(chat, mu_per_minute=10, best_effort_allowed=False, sold_by="test")
    _, operator = ApiKey.issue(name="router", tenant=None)
    _, owner_key = ApiKey.issue(name="app", tenant=owner)
    _, other_key = ApiKey.issue(name="app", tenant=other)
    with sim_engine("--profile", "tiny-test", "--time-scale", "20", "--served-model-name", "chat") as engine:
        Pod.objects.create(endpoint=chat, name="chat-0", url=engine.url, ready=True)
        cp_mode = ("--control-plane", live_server.url, "--poll-interval-s", "0.2")
        with router(*cp_mode, env={"ROUTER_KEY": operator}) as base:

            def client(key: str) -> openai.OpenAI:
                return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=30)

            owner_client = client(owner_key)
            deadline = time.monotonic() + 30
            while "chat" not in [m.id for m in owner_client.models.list().data]:
                assert time.monotonic() < deadline, "the router never loaded the endpoint"
                time.sleep(0.2)
            for m in owner_client.models.list().data:
                Model.model_validate(m.model_dump())
            with pytest.raises(openai.AuthenticationError):
                client("mu_not-a-key").completions.create(model="chat", prompt=PROMPT, max_tokens=4)
            with pytest.raises(openai.NotFoundError):
                client(other_key).completions.create(model="chat", prompt=PROMPT, max_tokens=4)
            with pytest.raises(openai.BadRequestError):
                owner_client.completions.create(model="chat", prompt=PROMPT, max_tokens=-1)
            streamed = list(
                owner_client.completions.create(model="chat", prompt=PROMPT, max_tokens=3, stream=True)
            )
            assert "".join(c.choices[0].text for c in streamed if c.choices)
            with pytest.raises(openai.RateLimitError) as throttled:
                for _ in range(20):
                    owner_client.completions.create(model="chat", prompt=PROMPT, max_tokens=400)
            assert float(throttled.value.response.headers["retry-after"]) > 0
