"""One workload (x-session-id, the OpenAI ``user`` field, else the API key) sticks to a small
subset of pods; the load guard leaves the subset when it runs hot."""

import asyncio

from dataplane.router.affinity import rendezvous_subset
from tests.router.conftest import TENANT_KEY, assert_idle, call, cp_table, running, with_config


def test_session_header_and_user_field_stick_to_two_pods():
    async def go():
        async with running(6, table=cp_table(reservation=None, mu_per_replica_minute=0)) as (router, _):
            ep = router.endpoints[1]
            for workload, extra in (
                ("sess-1", {"headers": {"x-session-id": "sess-1"}}),
                ("user-9", {"body_user": "user-9"}),
            ):
                expected = {p.name for p in rendezvous_subset(workload, ep.pods, 2)}
                seen = set()
                for _ in range(30):
                    body = {"model": "chat", "prompt": "hi"}
                    if "body_user" in extra:
                        body["user"] = extra["body_user"]
                    _, headers, _ = await call(
                        router, body=body, key=TENANT_KEY, headers=extra.get("headers")
                    )
                    seen.add(headers["x-pod"])
                assert seen <= expected and len(seen) == 2  # both pods of the subset, no other
            await assert_idle(router)

    asyncio.run(go())


def test_api_key_is_the_workload_without_session_or_user():
    async def go():
        async with running(6, table=cp_table(reservation=None, mu_per_replica_minute=0)) as (router, _):
            expected = {p.name for p in rendezvous_subset(TENANT_KEY, router.endpoints[1].pods, 2)}
            seen = {
                (await call(router, body={"model": "chat", "prompt": "hi"}, key=TENANT_KEY))[1]["x-pod"]
                for _ in range(20)
            }
            assert seen <= expected

    asyncio.run(go())


def test_load_guard_leaves_a_hot_subset():
    async def go():
        cfg = with_config(sticky_hot_ratio=0.5, sticky_hot_abs_mu=1.0)
        async with running(4, table=cp_table(reservation=None, mu_per_replica_minute=0), config=cfg) as (
            router,
            _,
        ):
            ep = router.endpoints[1]
            subset = rendezvous_subset("sess-hot", ep.pods, 2)
            for p in subset:  # pretend the subset is busy: 50 MU each, the others idle
                p.inflight_mu = 50.0
            # fleet mean 25 -> threshold 1.5 x 25 + 1 = 38.5 < 50: hot, go elsewhere
            _, headers, _ = await call(
                router,
                body={"model": "chat", "prompt": "hi"},
                key=TENANT_KEY,
                headers={"x-session-id": "sess-hot"},
            )
            assert headers["x-pod"] not in {p.name for p in subset}
            for p in subset:
                p.inflight_mu = 0.0

    asyncio.run(go())
