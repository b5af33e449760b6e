"""No ready pod and scale_to_zero_enabled: hold the request, ask the control plane to wake the
endpoint (404 tolerated), serve it when a pod appears, or 503 with Retry-After at the deadline."""

import asyncio

from dataplane.wire.routing_table import RoutingTable
from tests.router.conftest import TENANT_KEY, assert_idle, call, error_of, running, table_doc, with_config
from tests.router.test_control_plane_discovery import StandInControlPlane


def test_wake_then_503_at_the_deadline():
    async def go():
        cp = await StandInControlPlane().start()
        cfg = with_config(wake_deadline_s=0.4, wake_retry_s=0.1)
        table = RoutingTable.from_json(table_doc([], scale_to_zero_enabled=True))
        try:
            async with running([], table=table, config=cfg, control_plane=cp.url, key="op-key") as (
                router,
                _,
            ):
                loop = asyncio.get_running_loop()
                t0 = loop.time()
                status, headers, payload = await call(
                    router, body={"model": "chat", "prompt": "hi"}, key=TENANT_KEY
                )
                assert status == 503 and headers["retry-after"] == "1"
                assert error_of(payload)["code"] == "scaling_from_zero"
                assert 0.35 < loop.time() - t0 < 1.5
                assert cp.wakes and cp.wakes[0] == "/api/v1/endpoints/1/wake/"
                assert cp.requests[-1]["authorization"] == "Bearer op-key"
                await assert_idle(router)
        finally:
            await cp.stop()

    asyncio.run(go())


def test_held_request_is_served_when_a_pod_becomes_ready():
    async def go():
        cfg = with_config(wake_deadline_s=3.0)
        table = RoutingTable.from_json(table_doc([], scale_to_zero_enabled=True))
        async with running(1, table=table, config=cfg) as (router, pods):
            held = asyncio.ensure_future(call(router, body={"model": "chat", "prompt": "hi"}, key=TENANT_KEY))
            await asyncio.sleep(0.2)
            assert not held.done()
            router.apply(RoutingTable.from_json(table_doc(pods, version="v2", scale_to_zero_enabled=True)))
            status, _, _ = await asyncio.wait_for(held, 2)
            assert status == 200
            await assert_idle(router)

    asyncio.run(go())


def test_no_ready_pod_without_scale_to_zero_is_503_at_once():
    async def go():
        table = RoutingTable.from_json(table_doc([]))
        async with running([], table=table) as (router, _):
            status, headers, payload = await call(
                router, body={"model": "chat", "prompt": "hi"}, key=TENANT_KEY
            )
            assert status == 503 and error_of(payload)["code"] == "no_ready_pod" and "retry-after" in headers

    asyncio.run(go())


def test_best_effort_traffic_is_held_for_the_wake_not_refused():
    """Without a reservation every request is best effort, admitted on headroom: at zero pods an
    endpoint that scales to zero counts the replica the request wakes (else: 429 forever)."""

    async def go():
        cfg = with_config(wake_deadline_s=3.0)
        table = RoutingTable.from_json(table_doc([], scale_to_zero_enabled=True, reservation=None))
        async with running(1, table=table, config=cfg) as (router, pods):
            held = asyncio.ensure_future(call(router, body={"model": "chat", "prompt": "hi"}, key=TENANT_KEY))
            await asyncio.sleep(0.2)
            assert not held.done()
            doc = table_doc(pods, version="v2", scale_to_zero_enabled=True, reservation=None)
            router.apply(RoutingTable.from_json(doc))
            status, _, _ = await asyncio.wait_for(held, 2)
            assert status == 200
            await assert_idle(router)

    asyncio.run(go())
