"""A router in control-plane mode against the real control plane (live_server), on real ports:
the routing table no longer carries the tenants' keys, so a router looks a key it does not know
up by its digest. A new key works at its first request while the table's version stays put (300
new keys: no router downloads anything); a revoked key is refused within a poll and its tenant's
other keys keep working; a flood of random bearer tokens costs the control plane a bounded number
of lookups (counted on the wire, behind a relay); with the control plane away, known keys are
served and an unknown one is refused, never let in."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time

import httpx
import pytest
from django.db import connection

from controlplane.tenants.models import ApiKey
from dataplane.router.config import RouterConfig
from tests.router.conftest import call, error_of, scrape, wait_until
from tests.test_router_table_freshness import Relay, control_plane_router

pytestmark = pytest.mark.stack  # a live_server and routers on real ports

LOOKUP = b"GET /api/v1/routing-table/keys/"


class CountingRelay(Relay):
    """A relay that counts the key lookups going through it to the control plane."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.lookups = 0

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, count: bool) -> None:
            tail = b""
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    if count:
                        self.lookups += (tail + data).count(LOOKUP)
                        tail = data[-len(LOOKUP) + 1 :]
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))


def new_key(base: str, secret: str, name: str) -> tuple[int, str]:
    """POST /api/v1/api-keys/ as the tenant: the new key's id and secret."""
    made = httpx.post(
        f"{base}/api/v1/api-keys/",
        json={"name": name},
        headers={"authorization": f"Bearer {secret}"},
        timeout=30,
    )
    assert made.status_code == 201, made.text
    return made.json()["id"], made.json()["key"]


def issue(name: str, tenant) -> str:
    """A key made in a worker thread (the router's loop is async), its connection closed after:
    the test database is dropped at the end, which an open session would refuse."""
    try:
        return ApiKey.issue(name=name, tenant=tenant)[1]
    finally:
        connection.close()


async def models(router, key: str) -> int:
    return (await call(router, "/v1/models", key=key, method="GET"))[0]


@pytest.mark.django_db(transaction=True)
def test_new_keys_work_at_once_without_a_table_download_and_a_revoked_one_within_a_poll(
    live_server, owner, make_endpoint, settings
):
    settings.API_KEY_CREATIONS_PER_HOUR = 1000
    settings.API_KEYS_PER_TENANT_MAX = 1000
    make_endpoint(owner, "chat")
    _, operator = ApiKey.issue(name="router", tenant=None)
    _, first = ApiKey.issue(name="first", tenant=owner)

    async def go() -> None:
        router, discovery = await control_plane_router(RouterConfig(), live_server.url, operator)
        try:
            await wait_until(lambda: router.table is not None, timeout=10, what="the first table")
            table, etag = router.table, discovery.etag
            assert await models(router, first) == 200
            key_id, secret = await asyncio.to_thread(new_key, live_server.url, first, "fresh")
            assert await models(router, secret) == 200  # at its first request
            assert router.keys.lookups == 2  # one each, then kept
            assert await models(router, secret) == 200 and router.keys.lookups == 2
            for i in range(297):
                await asyncio.to_thread(issue, f"k{i}", owner)
            await asyncio.sleep(2 * discovery.max_poll_gap_s)  # polls: 304s
            assert discovery.etag == etag and router.table is table  # no table downloaded
            # Revoked: refused within a poll; the tenant's other keys are looked up again and work
            assert httpx.delete(
                f"{live_server.url}/api/v1/api-keys/{key_id}/", headers={"authorization": f"Bearer {first}"}
            ).status_code == 204  # fmt: skip
            revoked = time.monotonic()
            while await models(router, secret) == 200:
                assert time.monotonic() - revoked < 5, "the revoked key still works after 5 s"
                await asyncio.sleep(0.01)
            took = time.monotonic() - revoked
            status, _, body = await call(router, "/v1/models", key=secret, method="GET")
            assert status == 401 and error_of(body)["code"] == "invalid_api_key"
            assert await models(router, first) == 200
            # the revoked key once (its miss kept), the first key again: its tenant's epoch moved
            assert router.keys.lookups == 4
            print(f"revoked key refused after {took:.3f} s")
            assert took <= 2.0
        finally:
            await router.shutdown(0.5)

    asyncio.run(go())


@pytest.mark.django_db(transaction=True)
def test_a_flood_of_random_keys_makes_bounded_lookups_and_an_outage_lets_none_in(
    live_server, owner, make_endpoint
):
    make_endpoint(owner, "chat")
    _, operator = ApiKey.issue(name="router", tenant=None)
    _, known = ApiKey.issue(name="known", tenant=owner)
    config = RouterConfig(poll_interval_s=0.2)

    async def go() -> None:
        relay = await CountingRelay(live_server.url).start()
        router, _ = await control_plane_router(config, relay.url, operator)
        try:
            await wait_until(lambda: router.table is not None, timeout=10, what="the first table")
            assert await models(router, known) == 200
            assert relay.lookups == 1
            # 400 random bearer tokens, 50 at a time
            started = time.monotonic()
            statuses: list[int] = []
            for _ in range(8):
                batch = [models(router, "mu_" + secrets.token_urlsafe(32)) for _ in range(50)]
                statuses += await asyncio.gather(*batch)
            elapsed = time.monotonic() - started
            allowed = config.key_lookup_burst + config.key_lookups_per_s * elapsed + 1
            print(
                f"400 random keys in {elapsed:.2f} s: {relay.lookups - 1} lookups reached the control plane "
                f"(bound {allowed:.0f}); answers {sorted(set(statuses))}"
            )
            assert set(statuses) <= {401, 503} and 401 in statuses and 503 in statuses
            # (a lookup that timed out may not have reached it: the router counts attempts)
            assert relay.lookups - 1 <= router.keys.lookups - 1 <= allowed
            metrics = await scrape(router)
            assert metrics["router_api_key_checks_unavailable"].samples[0].value == statuses.count(503)
            # one unknown key over and over: one lookup, its miss kept
            await asyncio.sleep(1.0)  # the bucket refills
            before = relay.lookups
            same = "mu_" + secrets.token_urlsafe(32)
            assert {await models(router, same) for _ in range(30)} == {401}
            assert relay.lookups == before + 1
            # the control plane away: the known key works, a key it never saw is refused
            unseen = await asyncio.to_thread(issue, "unseen", owner)
            await relay.stop()
            assert await models(router, known) == 200
            status, headers, body = await call(router, "/v1/models", key=unseen, method="GET")
            assert status == 503 and headers.get("retry-after") == "1", body
            assert error_of(body)["code"] == "key_check_unavailable"
            assert hashlib.sha256(unseen.encode()).hexdigest() not in router.keys.known
            await relay.start()  # back: it works
            await asyncio.sleep(1.1)  # past the backoff after the failed lookup
            assert await models(router, unseen) == 200
        finally:
            await router.shutdown(0.5)
            with contextlib.suppress(Exception):
                await relay.stop()

    asyncio.run(go())
