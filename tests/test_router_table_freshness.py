"""A router in control-plane mode against the real control plane (live_server): a revoked key is
refused within 2 s, and keys from a table the control plane has not confirmed for longer than
the bound are refused (503) unless the operator chose fail-open. The router runs in this process
so that its clock (``Router.clock``) can be moved past the bound; the control plane goes away
behind a TCP relay, as it does behind a network partition."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.request
from dataclasses import replace
from urllib.parse import urlsplit

import pytest

from controlplane.endpoints.models import Pod
from controlplane.selling import sell
from controlplane.tenants.models import ApiKey
from dataplane.router.config import RouterConfig
from dataplane.router.discovery import ControlPlaneDiscovery, StaticDiscovery, static_table
from dataplane.router.server import Router
from dataplane.router.upstream import fetch
from tests.router.conftest import call, error_of, scrape, wait_until
from tests.runtime.support import sim_engine

pytestmark = pytest.mark.stack  # a live_server, engines and routers

HELLO = {"model": "chat", "prompt": "hi", "max_tokens": 2}


class Relay:
    """127.0.0.1:port -> the control plane; ``stop`` cuts it off (listener and connections)."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Relay:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.close()
        self._writers = []
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1)

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def control_plane_router(
    config: RouterConfig, url: str, operator: str
) -> tuple[Router, ControlPlaneDiscovery]:
    """A router wired as ``python -m dataplane.router --control-plane`` wires it."""
    router = Router(config, control_plane=url, key=operator)
    discovery = ControlPlaneDiscovery(
        url,
        operator,
        fetch,
        config.poll_interval_s,
        config.control_plane_timeout_s,
        on_confirmed=router.confirm_table,
    )
    await router.start("127.0.0.1", 0, discovery)
    return router, discovery


def revoke(base: str, key_id: int, key: str) -> int:
    """DELETE /api/v1/api-keys/{id}/ as the tenant itself: its status."""
    request = urllib.request.Request(
        f"{base}/api/v1/api-keys/{key_id}/", method="DELETE", headers={"authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


@pytest.mark.django_db(transaction=True)
def test_a_revoked_key_is_refused_within_two_seconds(live_server, owner, make_endpoint):
    make_endpoint(owner, "chat")
    _, operator = ApiKey.issue(name="router", tenant=None)
    keys = [ApiKey.issue(name=f"app-{i}", tenant=owner) for i in range(3)]
    config = RouterConfig()  # the default poll interval is what is under test

    async def go() -> list[float]:
        router, discovery = await control_plane_router(config, live_server.url, operator)
        took = []
        try:
            await wait_until(lambda: router.table is not None, timeout=10, what="the first table")
            for row, secret in keys:
                assert (await call(router, "/v1/models", key=secret, method="GET"))[0] == 200
                assert await asyncio.to_thread(revoke, live_server.url, row.pk, secret) == 204
                revoked = time.monotonic()
                while (await call(router, "/v1/models", key=secret, method="GET"))[0] == 200:
                    assert time.monotonic() - revoked < 5, "the revoked key still works after 5 s"
                    await asyncio.sleep(0.01)
                took.append(time.monotonic() - revoked)
                status, _, body = await call(router, "/v1/models", key=secret, method="GET")
                assert status == 401 and error_of(body)["code"] == "invalid_api_key"
        finally:
            await router.shutdown(0.5)
        assert discovery.max_poll_gap_s <= 1.2  # the bound by design, and then as measured:
        return took

    took = asyncio.run(go())
    print("revoked key refused after", [round(t, 3) for t in took], "s")
    assert max(took) <= 2.0, took


@pytest.mark.django_db(transaction=True)
def test_keys_from_a_stale_table_are_refused_unless_fail_open(live_server, owner, make_endpoint, caplog):
    chat = make_endpoint(owner, "chat")
    sell(chat, mu_per_minute=100, best_effort_allowed=True, sold_by="test")
    _, operator = ApiKey.issue(name="router", tenant=None)
    _, tenant = ApiKey.issue(name="app", tenant=owner)
    fast = RouterConfig(poll_interval_s=0.1, control_plane_timeout_s=0.5)

    async def scenario(config: RouterConfig, engine_url: str) -> None:
        relay = await Relay(live_server.url).start()
        router, _ = await control_plane_router(config, relay.url, operator)
        offset = 0.0
        router.clock = lambda: time.monotonic() + offset
        try:
            await wait_until(lambda: router.table is not None, timeout=10, what="the first table")
            assert (await call(router, body=HELLO, key=tenant))[0] == 200
            await relay.stop()  # the control plane is away: the router keeps its last table
            await asyncio.sleep(0.3)
            assert (await call(router, body=HELLO, key=tenant))[0] == 200  # within the bound
            offset = config.stale_table_after_s + 1  # ... and now past it
            models = await call(router, "/v1/models", key=tenant, method="GET")
            completion = await call(router, body=HELLO, key=tenant)
            metrics = await scrape(router)
            age = metrics["router_routing_table_age_seconds"].samples[0].value
            assert age > config.stale_table_after_s
            counted = {s.labels["outcome"]: s.value for s in metrics["router_stale_table_requests"].samples}
            if config.stale_table == "fail-closed":
                for status, headers, body in (models, completion):
                    assert status == 503 and headers.get("retry-after") == "5"
                    error = error_of(body)
                    assert error["code"] == "routing_table_stale"
                    assert error["message"].startswith("routing table stale since 20"), error
                assert counted == {"served": 0, "refused": 2}
                # The control plane back: the next poll's 304 confirms the table; keys work again.
                await relay.start()
                await wait_until(
                    lambda: (router.freshness.age_s(router.clock()) or 0) < 1, timeout=5, what="a 304"
                )
                assert (await call(router, body=HELLO, key=tenant))[0] == 200
            else:
                assert models[0] == 200 and completion[0] == 200
                assert counted == {"served": 2, "refused": 0}
                assert "serving its keys (fail-open)" in caplog.text
        finally:
            await router.shutdown(0.5)
            with contextlib.suppress(Exception):
                await relay.stop()

    caplog.set_level(logging.WARNING, logger="dataplane.router")
    with sim_engine("--profile", "tiny-test", "--time-scale", "20", "--served-model-name", "chat") as engine:
        Pod.objects.create(endpoint=chat, name="chat-0", url=engine.url, ready=True)
        asyncio.run(scenario(fast, engine.url))
        asyncio.run(scenario(replace(fast, stale_table="fail-open"), engine.url))


def test_static_mode_never_goes_stale():
    async def go() -> None:
        with sim_engine(
            "--profile", "tiny-test", "--time-scale", "20", "--served-model-name", "chat"
        ) as engine:
            router = Router(RouterConfig())
            await router.start("127.0.0.1", 0, StaticDiscovery(static_table([engine.url], "p2c-mu", 0)))
            try:
                await wait_until(lambda: router.table is not None, what="the table")
                router.clock = lambda: time.monotonic() + 10**7
                status, _, body = await call(router, body=HELLO)
                assert status == 200, body
                assert json.loads(body)["usage"]["completion_tokens"] == 2
            finally:
                await router.shutdown(0.5)

    asyncio.run(go())
