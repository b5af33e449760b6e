"""Every pod at its target concurrency: queue briefly, bounded in time and length, then 503."""

import asyncio

from tests.router.conftest import (
    TENANT_KEY,
    assert_idle,
    call,
    cp_table,
    error_of,
    running,
    wait_until,
    with_config,
)


def body():
    return {"model": "chat", "prompt": "hi", "max_tokens": 10}


def test_queued_request_runs_when_a_slot_frees():
    async def go():
        cfg = with_config(queue_wait_s=2.0)
        async with running(1, table=cp_table(target_concurrency_per_replica=1, reservation=None),
                           config=cfg) as (router, pods):
            pods[0].mode = "hold"
            first = asyncio.ensure_future(call(router, body=body(), key=TENANT_KEY))
            await wait_until(lambda: pods[0].requests, timeout=1)
            second = asyncio.ensure_future(call(router, body=body(), key=TENANT_KEY))
            await wait_until(lambda: router.endpoints[1].queued(), timeout=1)
            assert router.endpoints[1].queued() == 1 and pods[0].requests == 1  # waiting, not sent
            pods[0].release.set()
            assert (await first)[0] == 200 and (await second)[0] == 200
            await assert_idle(router)
    asyncio.run(go())


def test_queue_wait_bound_gives_503_with_retry_after():
    async def go():
        cfg = with_config(queue_wait_s=0.2)
        async with running(1, table=cp_table(target_concurrency_per_replica=1, reservation=None),
                           config=cfg) as (router, pods):
            pods[0].mode = "hold"
            first = asyncio.ensure_future(call(router, body=body(), key=TENANT_KEY))
            await asyncio.sleep(0.1)
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
        cfg = with_config(queue_wait_s=5.0, max_queued_requests=2)
        async with running(1, table=cp_table(target_concurrency_per_replica=1, reservation=None),
                           config=cfg) as (router, pods):
            pods[0].mode = "hold"
            held = [asyncio.ensure_future(call(router, body=body(), key=TENANT_KEY)) for _ in range(3)]
            await wait_until(lambda: router.endpoints[1].queued() == 2)
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
        cfg = with_config(queue_wait_s=5.0, max_queued_requests=1)
        async with running(1, table=cp_table(target_concurrency_per_replica=1, reservation=None),
                           config=cfg) as (router, pods):
            pods[0].mode = "hold"
            running_one = asyncio.ensure_future(call(router, body=body(), key=TENANT_KEY))
            await asyncio.sleep(0.1)
            waiting = asyncio.ensure_future(call(router, body=body(), key=TENANT_KEY))
            await asyncio.sleep(0.1)
            probe = asyncio.ensure_future(call(router, body=body(), key=TENANT_KEY, headers={"x-probe": "1"}))
            status, _, _ = await waiting
            assert status == 503  # shed for the probe
            pods[0].release.set()
            assert (await running_one)[0] == 200 and (await probe)[0] == 200
            await assert_idle(router)
    asyncio.run(go())


def test_target_concurrency_is_hot_reloaded_and_wakes_waiters():
    async def go():
        from dataplane.router.discovery import parse_routing_table
        from tests.router.conftest import table_doc
        cfg = with_config(queue_wait_s=3.0)
        async with running(1, table=cp_table(target_concurrency_per_replica=1, reservation=None),
                           config=cfg) as (router, pods):
            pods[0].mode = "hold"
            first = asyncio.ensure_future(call(router, body=body(), key=TENANT_KEY))
            await asyncio.sleep(0.1)
            second = asyncio.ensure_future(call(router, body=body(), key=TENANT_KEY))
            await asyncio.sleep(0.1)
            assert router.endpoints[1].queued() == 1
            router.apply(parse_routing_table(table_doc(pods, version="v2", target_concurrency_per_replica=2,
                                                       reservation=None)))
            await wait_until(lambda: pods[0].requests == 2, timeout=1)
            assert pods[0].requests == 2  # the waiter went as soon as the limit grew
            assert router.endpoints[1].pods[0].target_concurrency == 2
            pods[0].release.set()
            assert (await first)[0] == 200 and (await second)[0] == 200
            await assert_idle(router)
    asyncio.run(go())
