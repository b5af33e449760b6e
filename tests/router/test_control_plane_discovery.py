"""Control-plane mode: poll the routing table with ETag/304, keep the last good table when the
control plane is unreachable or answers garbage, and reload without dropping requests."""

import asyncio
import contextlib
import json

import pytest

from dataplane.router.discovery import ControlPlaneDiscovery
from dataplane.router.upstream import fetch
from dataplane.wire.routing_table import RoutedPod, RoutingTable
from tests.router.conftest import FAST, TENANT_KEY, call, sha, table_doc, wait_until
from tests.router.fakepod import FakePod


class StandInControlPlane:
    """Serves GET /api/v1/routing-table/ from ``doc`` (or ``garbage``); records requests."""

    def __init__(self) -> None:
        self.doc: dict | None = None
        self.garbage: bytes | None = None
        self.requests: list[dict[str, str]] = []
        self.wakes: list[str] = []
        self.port = 0
        self._server: asyncio.AbstractServer | None = None

    async def start(self, port: int = 0) -> "StandInControlPlane":
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _conn(self, reader, writer):
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            lines = head.split("\r\n")
            method, path, _ = lines[0].split(" ")
            pairs = (x.split(":", 1) for x in lines[1:] if ":" in x)
            headers = {k.strip().lower(): v.strip() for k, v in pairs}
            await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append(headers)
            if method == "POST" and path.endswith("/wake/"):
                self.wakes.append(path)
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            elif headers.get("authorization") != "Bearer op-key":
                writer.write(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n")
            elif self.garbage is not None:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(self.garbage), self.garbage)
                )
            elif headers.get("if-none-match") == self.doc["version"]:
                etag = self.doc["version"].encode()
                writer.write(b"HTTP/1.1 304 Not Modified\r\netag: %s\r\n\r\n" % etag)
            else:
                body = json.dumps(self.doc).encode()
                etag = self.doc["version"].encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\netag: %s\r\n"
                    b"content-length: %d\r\n\r\n%s" % (etag, len(body), body)
                )
            await writer.drain()
        finally:
            writer.close()


def test_the_routing_table_contract():
    doc = table_doc([], reservation=None, pods=(RoutedPod("chat-0", "http://127.0.0.1:9001", True),))
    t = RoutingTable.from_json(doc)
    ep = t.endpoints[0]
    assert (ep.id, ep.tenant, ep.name, ep.policy, ep.target_concurrency) == (1, "acme", "chat", "p2c-mu", 8)
    assert ep.coefficients.beta == 0.02 and ep.reservation is None and ep.pods[0].name == "chat-0"
    assert t.api_keys[sha(TENANT_KEY)] == "acme" and t.auth_required


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("version"), "version"),
        (lambda d: d["endpoints"][0].update(policy="fastest"), "policy"),
        (lambda d: d["endpoints"][0].update(alpha="x"), "alpha"),
        (lambda d: d["endpoints"][0].update(pods=[{"name": "p"}]), "url"),
        (lambda d: d.update(api_keys=[{"hash": 1}]), "api_keys"),
    ],
)
def test_parse_rejects_garbage_naming_the_field(mutate, message):
    doc = table_doc([])
    mutate(doc)
    with pytest.raises(ValueError, match=message):
        RoutingTable.from_json(doc)


def test_etag_304_unreachable_and_garbage_keep_the_last_good_table():
    async def go():
        cp = await StandInControlPlane().start()
        try:
            cp.doc = table_doc([], version="v1")
            d = ControlPlaneDiscovery(cp.url, "op-key", fetch, timeout_s=1)
            t1 = await d.poll_once()
            assert t1 is not None and t1.version == "v1" and d.etag == "v1"
            assert cp.requests[-1]["authorization"] == "Bearer op-key"
            assert await d.poll_once() is None  # 304
            assert cp.requests[-1]["if-none-match"] == "v1"
            cp.garbage = b"<html>oops</html>"
            assert await d.poll_once() is None and d.failures == 1
            cp.garbage = b'{"version": "v9", "endpoints": "nope", "api_keys": []}'
            assert await d.poll_once() is None and d.failures == 2 and d.etag == "v1"
            cp.garbage = None
            cp.doc = table_doc([], version="v2")
            t2 = await d.poll_once()
            assert t2 is not None and t2.version == "v2" and d.failures == 0
            await cp.stop()
            assert await d.poll_once() is None and d.failures == 1  # unreachable
        finally:
            await cp.stop()

    asyncio.run(go())


def test_router_follows_the_control_plane_and_serves_through_outages():
    async def go():
        from dataplane.router.server import Router

        pods = [await FakePod(f"pod-{i}").start() for i in range(2)]
        cp = await StandInControlPlane().start()
        router = Router(FAST, control_plane=cp.url, key="op-key")
        try:
            cp.doc = table_doc(pods[:1], version="v1")
            disc = ControlPlaneDiscovery(cp.url, "op-key", fetch, poll_interval_s=0.05, timeout_s=0.5)
            await router.start("127.0.0.1", 0, disc)
            await asyncio.wait_for(router.table_loaded.wait(), 2)
            status, headers, _ = await call(router, body={"model": "chat", "prompt": "hi"}, key=TENANT_KEY)
            assert status == 200 and headers["x-pod"] == "pod-0"
            # a hold request in flight on pod-0 survives a reload that removes pod-0
            pods[0].mode = "hold"
            slow = asyncio.ensure_future(call(router, body={"model": "chat", "prompt": "hi"}, key=TENANT_KEY))
            await wait_until(lambda: pods[0].requests == 2, timeout=1)
            cp.doc = table_doc(pods[1:], version="v2")
            await wait_until(lambda: router.table.version == "v2")
            assert router.table.version == "v2"
            pods[0].release.set()
            status, _, _ = await slow
            assert status == 200
            status, headers, _ = await call(router, body={"model": "chat", "prompt": "hi"}, key=TENANT_KEY)
            assert headers["x-pod"] == "pod-1"
            # control plane down, then garbage: the router keeps serving v2
            cp.garbage = b"not json"
            await asyncio.sleep(0.2)
            await cp.stop()
            await asyncio.sleep(0.2)
            status, headers, _ = await call(router, body={"model": "chat", "prompt": "hi"}, key=TENANT_KEY)
            assert status == 200 and headers["x-pod"] == "pod-1" and router.table.version == "v2"
        finally:
            await router.shutdown(0.5)
            await cp.stop()
            for p in pods:
                await p.stop()

    asyncio.run(go())
