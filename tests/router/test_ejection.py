"""A pod failing N times in a row is ejected; a successful GET /health re-admits it."""

import asyncio

from dataplane.router.discovery import static_table
from tests.router.conftest import assert_idle, call, running, with_config
from tests.router.fakepod import FakePod


def test_eject_after_consecutive_failures_then_readmit_after_probe():
    async def go():
        pods = [await FakePod("a").start(), await FakePod("b").start()]
        cfg = with_config(eject_after_failures=2, eject_backoff_s=0.2, max_attempts=3)
        table = static_table([p.url for p in pods], "round-robin", 0)
        async with running(pods, table=table, config=cfg) as (router, _):
            bad = router.endpoints[0].pods[0]
            url_a = pods[0].url
            await pods[0].stop()  # refuse connections
            for _ in range(4):
                status, headers, _ = await call(router, body={"model": "m", "prompt": "hi"})
                assert status == 200 and headers["x-pod"] == pods[1].url
            assert bad.ejected
            served_b = pods[1].requests
            # while ejected, no request is even tried on it
            for _ in range(4):
                status, _, body = await call(router, body={"model": "m", "prompt": "hi"})
                assert status == 200, body
            assert pods[1].requests == served_b + 4
            # bring the pod back on the same port; the probe re-admits it after the backoff
            port = int(url_a.rsplit(":", 1)[1])
            revived = FakePod("a2")
            revived._server = await asyncio.start_server(revived._conn, "127.0.0.1", port)
            revived.port = port
            try:
                for _ in range(100):
                    router.tick()
                    if not bad.ejected:
                        break
                    await asyncio.sleep(0.05)
                assert not bad.ejected and revived.health_checks >= 1
                for _ in range(4):
                    await call(router, body={"model": "m", "prompt": "hi"})
                assert revived.requests == 2  # back in the round-robin rotation
                await assert_idle(router)
            finally:
                await revived.stop()

    asyncio.run(go())


def test_failed_probe_keeps_the_pod_out():
    async def go():
        cfg = with_config(eject_after_failures=1, eject_backoff_s=0.05)
        async with running(2, config=cfg) as (router, pods):
            pod = router.endpoints[0].pods[0]
            pods[0].health_ok = False
            from dataplane.router import balancer

            balancer.record_failure(pod, router.clock(), 1, 0.05)
            assert pod.ejected
            for _ in range(30):
                router.tick()
                await asyncio.sleep(0.02)
            assert pod.ejected and pods[0].health_checks >= 2 and pod.ejections >= 2

    asyncio.run(go())


def test_a_pod_answering_500s_is_ejected():
    async def go():
        pods = [await FakePod("a", mode="error").start(), await FakePod("b").start()]
        cfg = with_config(eject_after_failures=2, eject_backoff_s=60)
        table = static_table([p.url for p in pods], "round-robin", 0)
        async with running(pods, table=table, config=cfg) as (router, _):
            broken = router.endpoints[0].pods[0]
            statuses = [(await call(router, body={"model": "m", "prompt": "hi"}))[0] for _ in range(6)]
            # a 500 is answered to its client (bytes came back: never retried), and counts
            assert statuses[:4].count(500) == 2 and broken.ejected
            assert statuses[4:] == [200, 200]  # ejected: the healthy pod takes everything
            await assert_idle(router)

    asyncio.run(go())
