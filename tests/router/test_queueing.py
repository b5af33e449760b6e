"""Every pod at its target concurrency: queue briefly, bounded in time and length, then 503."""

import asyncio

from dataplane.wire.routing_table import RoutingTable
from tests.router.conftest import (
    TENANT_KEY,
    assert_idle,
    call,
    cp_table,
    error_of,
    running,
    table_doc,
    wait_until,
    with_config,
)


def body():
    return {"model": "chat", "prompt": "hi", "max_tokens": 10}


PROBE_KEY = b"probe-secret"


def one_slot(**kw):
    """One pod with target concurrency 1 and no reservation; ``kw`` overrides the config."""
    return running(
        1,
        table=cp_table(target_concurrency=1, reservation=None),
        config=with_config(**kw),
        probe_key=PROBE_KEY,
    )


async def occupy(router, pods, headers=None):
    """Start a request that the pod holds (mode "hold"); return once it reached the pod."""
    pods[0].mode = "hold"
    before = pods[0].requests
    task = asyncio.ensure_future(call(router, body=body(), key=TENANT_KEY, headers=headers))
    await wait_until(lambda: pods[0].requests > before, timeout=1)
    return task


async def enqueue(router, n=1, headers=None):
    """Start a request and return once the endpoint's queue holds ``n``."""
    task = asyncio.ensure_future(call(router, body=body(), key=TENANT_KEY, headers=headers))
    await wait_until(lambda: router.endpoints[1].queued() == n, timeout=1)
    return task


def test_queued_request_runs_when_a_slot_frees():
    async def go():
        async with one_slot(queue_wait_s=2.0) as (router, pods):
            first = await occupy(router, pods)
            second = await enqueue(router)
            assert pods[0].requests == 1  # waiting in the router, not sent
            pods[0].release.set()
            assert (await first)[0] == 200 and (await second)[0] == 200
            await assert_idle(router)

    asyncio.run(go())


def test_queue_wait_bound_gives_503_with_retry_after():
    async def go():
        async with one_slot(queue_wait_s=0.2) as (router, pods):
            first = await occupy(router, pods)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            status, headers, payload = await call(router, body=body(), key=TENANT_KEY)
            assert status == 503 and headers["retry-after"] == "1"
            assert error_of(payload)["code"] == "overloaded"
            assert 0.15 < loop.time() - t0 < 1.0
            pods[0].release.set()
            assert (await first)[0] == 200
            await assert_idle(router)

    asyncio.run(go())


def test_queue_length_bound_rejects_at_once():
    async def go():
        async with one_slot(queue_wait_s=5.0, max_queued_requests=2) as (router, pods):
            held = [await occupy(router, pods), await enqueue(router, 1), await enqueue(router, 2)]
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            status, _, _ = await call(router, body=body(), key=TENANT_KEY)
            assert status == 503 and loop.time() - t0 < 0.5  # no wait: the queue is full
            pods[0].release.set()
            assert [(await h)[0] for h in held] == [200, 200, 200]
            await assert_idle(router)

    asyncio.run(go())


def test_probe_displaces_a_best_effort_waiter_from_a_full_queue():
    async def go():
        async with one_slot(queue_wait_s=5.0, max_queued_requests=1) as (router, pods):
            running_one = await occupy(router, pods)
            waiting = await enqueue(router)
            probe = asyncio.ensure_future(
                call(router, body=body(), key=TENANT_KEY, headers={"x-probe": PROBE_KEY.decode()})
            )
            status, _, _ = await waiting
            assert status == 503  # shed for the probe
            pods[0].release.set()
            assert (await running_one)[0] == 200 and (await probe)[0] == 200
            await assert_idle(router)

    asyncio.run(go())


def test_target_concurrency_is_hot_reloaded_and_wakes_waiters():
    async def go():
        async with one_slot(queue_wait_s=3.0) as (router, pods):
            first = await occupy(router, pods)
            second = await enqueue(router)
            router.apply(
                RoutingTable.from_json(table_doc(pods, version="v2", target_concurrency=2, reservation=None))
            )
            await wait_until(lambda: pods[0].requests == 2, what="the waiter to go")
            assert router.endpoints[1].pods[0].target_concurrency == 2
            pods[0].release.set()
            assert (await first)[0] == 200 and (await second)[0] == 200
            await assert_idle(router)

    asyncio.run(go())
