"""Versions and their traffic shares (rollouts, canaries): a version at 0 % takes no new request,
a 90/10 canary gets about one request in ten, and a pod without a version serves them all."""

import asyncio

from dataplane.wire.routing_table import ReservedRate, RoutedPod, RoutingTable
from tests.router.conftest import TENANT_KEY, assert_idle, call, running, table_doc


def versioned(pods, versions, **endpoint):
    routed = tuple(RoutedPod(p.name, p.url, True, v) for p, v in zip(pods, versions, strict=True))
    doc = table_doc(pods, reservation=ReservedRate(1e9, best_effort_allowed=True), pods=routed, **endpoint)
    return RoutingTable.from_json(doc)


async def send(router, n):
    for _ in range(n):
        status, _, _ = await call(router, body={"model": "chat", "prompt": "hi"}, key=TENANT_KEY)
        assert status == 200


def test_a_draining_version_gets_no_new_request():
    async def go():
        async with running(2) as (router, pods):
            router.apply(versioned(pods, ["1", "2"], traffic=(("1", 0), ("2", 100))))
            await send(router, 20)
            assert (pods[0].requests, pods[1].requests) == (0, 20)
            await assert_idle(router)

    asyncio.run(go())


def test_a_canary_gets_its_share():
    async def go():
        async with running(4) as (router, pods):
            # v1 on three pods at 90 %, v2 on one pod at 10 % (the router's rng is seeded).
            router.apply(versioned(pods, ["1", "1", "1", "2"], traffic=(("1", 90), ("2", 10))))
            await send(router, 400)
            canary = pods[3].requests
            assert 20 <= canary <= 60, canary  # 40 expected; binomial sd 6
            assert sum(p.requests for p in pods) == 400

    asyncio.run(go())


def test_without_a_split_every_pod_serves():
    async def go():
        async with running(2) as (router, pods):
            router.apply(versioned(pods, ["", ""]))
            await send(router, 20)
            assert pods[0].requests > 0 and pods[1].requests > 0
            bad = table_doc(pods)
            bad["endpoints"][0]["traffic"] = ["1"]  # a list of versions, not their shares
            try:
                RoutingTable.from_json(bad)
            except ValueError as exc:
                assert "endpoints[0].traffic must be an object" in str(exc)
            else:
                raise AssertionError("a list of versions is not a traffic split")

    asyncio.run(go())
