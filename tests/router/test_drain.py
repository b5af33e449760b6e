"""Graceful shutdown: stop accepting, finish in-flight requests for a bounded time, then cut."""

import asyncio

from tests.router.conftest import call, running, wait_until, with_config


def test_drain_finishes_in_flight_and_refuses_new_connections():
    async def go():
        async with running(1, config=with_config(drain_timeout_s=3.0)) as (router, pods):
            pods[0].mode = "hold"
            inflight = asyncio.ensure_future(call(router, body={"model": "m", "prompt": "hi"}))
            await wait_until(lambda: pods[0].requests, timeout=1)
            port = router.port
            shutdown = asyncio.ensure_future(router.shutdown())
            await asyncio.sleep(0.1)
            try:  # no longer accepting
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                refused = False
            except OSError:
                refused = True
            assert refused
            assert not shutdown.done()  # waiting for the held request
            pods[0].release.set()
            status, headers, _ = await inflight
            assert status == 200 and headers.get("connection") == "close"
            assert await asyncio.wait_for(shutdown, 2) == 0  # nothing cut

    asyncio.run(go())


def test_drain_deadline_cuts_what_is_left():
    async def go():
        async with running(1) as (router, pods):
            pods[0].mode = "hold"
            inflight = asyncio.ensure_future(call(router, body={"model": "m", "prompt": "hi"}))
            await wait_until(lambda: pods[0].requests, timeout=1)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            cut = await router.shutdown(0.2)
            assert cut == 1 and loop.time() - t0 < 1.5
            try:
                await inflight
                raise AssertionError("the cut request should fail")
            except (ConnectionError, OSError):
                pass
            assert router.state.active_requests == 0
            assert router.endpoints[0].pods[0].inflight_requests == 0

    asyncio.run(go())
