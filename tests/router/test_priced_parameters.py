"""Through the router: a request is priced from what the engine will generate, a bad value is a
400 naming the parameter (nothing reaches a pod, nothing is metered), the probe class needs the
prober credential and a tenant's priority reaches the pod clamped."""

import asyncio

import pytest

from dataplane.router.cache_salt import tenant_salt
from dataplane.router.pricing import CostModel
from dataplane.wire.routing_table import ReservedRate
from tests.image_files import data_url, image_part, png
from tests.router.conftest import (
    TENANT_KEY,
    assert_idle,
    call,
    cp_table,
    error_of,
    routing_table,
    running,
    wait_until,
)

PROBE_KEY = b"probe-secret"
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
BIG = b"1" + b"0" * 400  # 10**400: Python's json reads it as an int


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        (COMP, b'{"model": "chat", "prompt": "hi", "max_tokens": 100000000000000000000000000}',
         "max_tokens"),
        (COMP, b'{"model": "chat", "prompt": "hi", "max_tokens": %s}' % BIG, "max_tokens"),
        (COMP, b'{"model": "chat", "prompt": "hi", "max_tokens": 1e400}', "max_tokens"),
        (COMP, b'{"model": "chat", "prompt": "hi", "n": %s}' % BIG, "n"),
        (COMP, b'{"model": "chat", "prompt": {"a": 1}}', "prompt"),
        (CHAT, b'{"model": "chat", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}',
         "messages[0].content[0].text"),
        (CHAT, b'{"model": "chat", "messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        (CHAT, b'{"model": "chat", "messages": [{"role": "u", "content": [7]}]}', "messages[0].content[0]"),
        (CHAT, b'{"model": "chat", "messages": "hi"}', "messages"),
        (CHAT, b'{"model": "chat", "messages": [], "max_completion_tokens": -3}', "max_completion_tokens"),
        # vLLM refuses a budget of 0 only after tokenising the prompt, its 400 then priced 1 token
        (CHAT, b'{"model": "chat", "messages": [], "max_completion_tokens": 0}', "max_completion_tokens"),
        (CHAT, b'{"model": "chat", "messages": [], "max_tokens": 0}', "max_tokens"),
        (COMP, b'{"model": "chat", "prompt": "hi", "max_tokens": 0}', "max_tokens"),
        (COMP, b'{"model": "chat", "prompt": "hi", "max_tokens": 0, "echo": false}', "max_tokens"),
        # vLLM reads a part without "type" but with an image_url string as an image, and fetches it
        (CHAT, b'{"model": "chat", "messages": [{"role": "user", "content": [{"image_url": '
               b'"http://169.254.169.254/latest/meta-data/"}]}]}',
         "messages[0].content[0].image_url"),
        (CHAT, b'{"model": "chat", "messages": [{"role": "user", "content": [{"type": 5, "text": "hi"}]}]}',
         "messages[0].content[0].type"),
        (CHAT, b'{"model": "chat", "messages": [{"role": "user", "content": [{"type": "video_url", '
               b'"video_url": {"url": "http://10.0.0.1/big.mp4"}}]}]}', "messages[0].content[0]"),
        (CHAT, b'{"model": "chat", "messages": [{"role": "user", "content": [{"type": "audio_url", '
               b'"audio_url": {"url": "http://10.0.0.1/a.wav"}}]}]}', "messages[0].content[0]"),
        # vLLM hashes the image by the client's uuid: a cache shared by tenants would answer it
        (CHAT, b'{"model": "chat", "messages": [{"role": "user", "content": [{"type": "image_url", '
               b'"image_url": {"url": "data:image/png;base64,AAAA"}, "uuid": "victim-image-1"}]}]}',
         "messages[0].content[0].uuid"),
        # vLLM's Qwen2-VL resizes to the request's min_pixels: a 1 x 1 image priced 4 tokens, 16,384 run
        (CHAT, b'{"model": "chat", "messages": [], "mm_processor_kwargs": {"min_pixels": 12845056, '
               b'"max_pixels": 12845056}}', "mm_processor_kwargs"),
    ],
)  # fmt: skip
def test_a_bad_value_is_a_400_naming_it_and_nothing_is_metered(path, raw, param):
    async def go():
        async with running(1, table=cp_table()) as (router, pods):
            status, _, body = await call(router, path=path, body=raw, key=TENANT_KEY)
            assert status == 400, body
            err = error_of(body)
            assert err["param"] == param and err["type"] == "invalid_request_error", err
            assert len(body) < 1000  # a 10**400 is not echoed back whole
            assert pods[0].requests == 0
            totals = router.meter.totals.get((1, "acme"))
            assert totals is None or (totals.requests, totals.mu, totals.errors) == (0, 0.0, 0)
            await assert_idle(router)

    asyncio.run(go())


PNG_448 = data_url(png(448, 448))  # 256 image tokens


@pytest.mark.parametrize(
    "part",
    [
        {"image_url": {"url": PNG_448}},  # vLLM's validation takes a typeless image only as a string
        {"type": None, "image_url": {"url": PNG_448}},
        {"text": "hi"},
        {"type": None, "text": "hi"},
        {"refusal": "no"},
        {},
    ],
    ids=["image_url_object", "null_type_image_url_object", "text", "null_type_text", "refusal", "empty"],
)
def test_a_part_without_a_type_vllm_refuses_is_a_400_naming_it_before_any_pod(part):
    async def go():
        async with running(1, table=cp_table()) as (router, pods):
            body = {"model": "chat", "messages": [{"role": "user", "content": ["look:", part]}]}
            status, _, payload = await call(router, path=CHAT, body=body, key=TENANT_KEY)
            assert status == 400, payload
            err = error_of(payload)
            assert err["param"] == "messages[0].content[1].type", err
            assert err["message"].startswith("messages[0].content[1] has no type"), err
            assert pods[0].requests == 0
            assert router.meter.totals.get((1, "acme")) is None
            await assert_idle(router)

    asyncio.run(go())


@pytest.mark.parametrize("kind", ["blob", "file", "TEXT", "image", "input_text", "output_text"])
def test_a_part_of_a_type_vllm_does_not_read_is_a_400_naming_it_before_any_pod(kind):
    """vLLM refuses these too (tests/runtime/test_sim_matches_vllm.py: chat_bad_part), but only
    after the request was admitted and sent to a pod."""

    async def go():
        async with running(1, table=cp_table()) as (router, pods):
            part = {"type": kind, "text": "hi", "file": {"file_id": "f"}}
            body = {"model": "chat", "messages": [{"role": "user", "content": ["look:", part]}]}
            status, _, payload = await call(router, path=CHAT, body=body, key=TENANT_KEY)
            assert status == 400, payload
            err = error_of(payload)
            assert err["param"] == "messages[0].content[1].type", err
            assert f"type {kind!r} is not a chat content part type" in err["message"], err
            assert "image_url" in err["message"] and "text" in err["message"]
            assert pods[0].requests == 0
            assert router.meter.totals.get((1, "acme")) is None
            await assert_idle(router)

    asyncio.run(go())


@pytest.mark.parametrize(
    "part", [{"image_url": PNG_448}, {"type": None, "image_url": PNG_448}], ids=["no_type", "null_type"]
)
def test_a_bare_image_url_without_a_type_is_priced_as_the_image_vllm_reads(part):
    async def go():
        async with running(1, table=cp_table(reservation=None)) as (router, pods):

            def asking(*content):
                return {
                    "model": "chat",
                    "messages": [{"role": "user", "content": list(content)}],
                    "max_tokens": 4,
                }

            typed = await estimate_of(router, pods, CHAT, asking("look:", image_part(png(448, 448))))
            text_only = await estimate_of(router, pods, CHAT, asking("look:"))
            assert typed > text_only  # the image's 256 tokens are in the price
            assert await estimate_of(router, pods, CHAT, asking("look:", part)) == pytest.approx(typed)
            assert pods[0].bodies[-1]["messages"][0]["content"][1] == part  # as sent: vLLM reads it

    asyncio.run(go())


def test_an_echo_with_no_budget_reaches_the_pod_as_vllm_takes_it():
    async def go():
        async with running(1, table=cp_table()) as (router, pods):
            body = {"model": "chat", "prompt": "hi", "max_tokens": 0, "echo": "true"}
            assert (await call(router, path=COMP, body=body, key=TENANT_KEY))[0] == 200
            assert pods[0].requests == 1

    asyncio.run(go())


@pytest.mark.parametrize("gamma", [-0.02, 0.1])
def test_a_request_the_pod_refuses_costs_nothing_and_hands_its_estimate_back(gamma):
    """A pod's 400 (it refused the request while reading it, before any GPU work) is metered at
    0 MU and its admission estimate is handed back: under a 6 MU/min reservation without best
    effort, 200 requests the pod refuses all reach it, none throttled (the pods are the
    endpoint's own: a tenant's refused requests load nobody else's)."""
    coefficients = CostModel(0.002, 0.02, gamma)
    reservation = ReservedRate(6, best_effort_allowed=False)  # 0.1 MU/s

    async def go():
        # not from cp_table's JSON: the control plane refuses gamma < 0 there, the router must not rely on it
        table = lambda fakes: routing_table(fakes, coefficients=coefficients, reservation=reservation)  # noqa: E731
        async with running(1, table=table) as (router, pods):
            pods[0].mode = "refuse"
            body = {"model": "chat", "prompt": "x" * 800, "max_tokens": 1}
            status, headers, _ = await call(router, path=COMP, body=body, key=TENANT_KEY)
            assert status == 400 and headers["x-mu-cost"] == "0"
            statuses = [(await call(router, path=COMP, body=body, key=TENANT_KEY))[0] for _ in range(200)]
            assert statuses == [400] * 200 and pods[0].requests == 201
            totals = router.meter.totals[(1, "acme")]
            assert (totals.requests, totals.mu, totals.throttled) == (201, 0.0, 0)

    asyncio.run(go())


def test_the_context_length_comes_from_the_routing_table():
    async def go():
        async with running(1, table=cp_table(max_model_len=100)) as (router, pods):
            body = {"model": "chat", "prompt": "hi", "max_tokens": 101}
            status, _, payload = await call(router, body=body, key=TENANT_KEY)
            assert status == 400 and error_of(payload)["param"] == "max_tokens"
            assert "100" in error_of(payload)["message"]
            assert (await call(router, body={**body, "max_tokens": 100}, key=TENANT_KEY))[0] == 200
            assert pods[0].requests == 1

    asyncio.run(go())


async def estimate_of(router, pods, path, body):
    """The MU the router admitted a request at (its pod's in-flight MU while the pod holds it)."""
    pods[0].mode = "hold"
    pods[0].release.clear()  # held again when called before
    seen = pods[0].requests
    task = asyncio.ensure_future(call(router, path=path, body=body, key=TENANT_KEY))
    await wait_until(lambda: pods[0].requests == seen + 1, what="the request to reach the pod")
    mu = router.endpoints[1].pods[0].inflight_mu
    pods[0].release.set()
    assert (await task)[0] == 200
    await assert_idle(router)
    return mu


@pytest.mark.parametrize(
    ("path", "body", "mu"),
    [
        # /v1/completions knows no max_completion_tokens: the engine generates max_tokens 200
        # (today's router priced 1 token: 0.002 + 0.02 + 0.1)
        (COMP, {"prompt": "abcd", "max_completion_tokens": 1, "max_tokens": 200}, 0.002 + 4 + 0.1),
        # chat: max_completion_tokens wins
        (CHAT, {"messages": [], "max_completion_tokens": 1, "max_tokens": 200}, 0.02 + 0.1),
        # 3 prompts x n 2 = 6 sequences of 100 tokens (today: x n only, 2 sequences)
        (COMP, {"prompt": ["abcd"] * 3, "n": 2, "max_tokens": 100}, 0.006 + 12 + 0.1),
    ],
)  # fmt: skip
def test_the_estimate_prices_what_the_engine_will_generate(path, body, mu):
    async def go():
        async with running(1, table=cp_table(reservation=None)) as (router, pods):
            assert await estimate_of(router, pods, path, {"model": "chat", **body}) == pytest.approx(mu)

    asyncio.run(go())


def test_a_tenant_priority_reaches_the_pod_clamped_and_a_probe_s_untouched():
    async def go():
        async with running(1, table=cp_table(), probe_key=PROBE_KEY) as (router, pods):
            base = {"model": "chat", "prompt": "hi", "max_tokens": 2}
            for priority in (-1000, "-5", 3):
                assert (await call(router, body={**base, "priority": priority}, key=TENANT_KEY))[0] == 200
            probe = {"x-probe": PROBE_KEY.decode()}
            assert (await call(router, body={**base, "priority": -1000}, key=TENANT_KEY, headers=probe))[
                0
            ] == 200
            assert [b["priority"] for b in pods[0].bodies] == [0, 0, 3, -1000]
            # the rest of the body as sent, and the tenant's cache_salt (test_pod_body_salt)
            assert pods[0].bodies[0] == {**base, "priority": 0, "cache_salt": tenant_salt("acme")}

    asyncio.run(go())
