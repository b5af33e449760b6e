"""Through the router: a request is priced from what the engine will generate, a bad value is a
400 naming the parameter (nothing reaches a pod, nothing is metered), the probe class needs the
prober credential and a tenant's priority reaches the pod clamped."""

import asyncio

import pytest

from tests.router.conftest import TENANT_KEY, assert_idle, call, cp_table, error_of, running, wait_until

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
        (CHAT, b'{"model": "chat", "messages": [{"role": "user", "content": [{"text": 5}]}]}',
         "messages[0].content[0].text"),
        (CHAT, b'{"model": "chat", "messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        (CHAT, b'{"model": "chat", "messages": [{"role": "u", "content": [7]}]}', "messages[0].content[0]"),
        (CHAT, b'{"model": "chat", "messages": "hi"}', "messages"),
        (CHAT, b'{"model": "chat", "messages": [], "max_completion_tokens": -3}', "max_completion_tokens"),
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
    task = asyncio.ensure_future(call(router, path=path, body=body, key=TENANT_KEY))
    await wait_until(lambda: pods[0].requests == 1, what="the request to reach the pod")
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
            assert pods[0].bodies[0] == {**base, "priority": 0}  # the rest of the body as sent

    asyncio.run(go())
