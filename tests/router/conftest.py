"""Helpers for router tests: start a router and fake pods on 127.0.0.1 inside ``asyncio.run``,
and always clean them up; raw HTTP client calls with deadlines; the idle-counter assertion."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import pytest

from dataplane.router.config import RouterConfig
from dataplane.router.discovery import StaticDiscovery, static_table
from dataplane.router.pricing import CostModel
from dataplane.router.server import Router
from dataplane.wire import images as wire_images
from dataplane.wire.routing_table import ReservedRate, RoutedEndpoint, RoutedPod, RoutingTable
from tests.router.fakepod import FakePod
from tests.runtime.support import free_port, free_ports  # noqa: F401 (the router tests import them from here)

# Short waits for what the router waits on, but production's deadlines for reading a client's
# request: a test's loop is its router's too, and a stall of it (a full collection of a large
# heap, a descheduled process on a busy machine) longer than a sub-second deadline times out a
# client that already sent its request (test_a_stall_of_the_loop_cuts_no_client); the tests of
# those deadlines set their own.
FAST = RouterConfig(
    upstream_connect_timeout_s=0.5,
    queue_wait_s=0.3,
    wake_deadline_s=0.5,
    wake_retry_s=0.1,
    drain_timeout_s=1.0,
    eject_backoff_s=0.05,
    probe_timeout_s=0.5,
)
TENANT_KEY = "sk-acme-secret"
OTHER_KEY = "sk-globex-secret"


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def routing_table(fakes: Sequence[FakePod], version: str = "v1", **endpoint: Any) -> RoutingTable:
    """One endpoint, "chat" of tenant acme, on these fake pods, with RoutedEndpoint fields
    overridden by ``endpoint``."""
    chat = RoutedEndpoint(
        id=1,
        tenant="acme",
        name="chat",
        model="llama-3.1-70b-instruct",
        policy="p2c-mu",
        coefficients=CostModel(0.002, 0.02, 0.1),
        mu_per_replica_minute=100,
        target_concurrency=8,
        scale_to_zero_enabled=False,
        reservation=ReservedRate(800, best_effort_allowed=True),
        pods=tuple(RoutedPod(p.name, p.url, True) for p in fakes),
    )
    keys = {sha(TENANT_KEY): "acme", sha(OTHER_KEY): "globex"}
    return RoutingTable(version, (replace(chat, **endpoint),), keys)


def table_doc(fakes: Sequence[FakePod], version: str = "v1", **endpoint: Any) -> dict[str, Any]:
    """The table as the control plane serves it."""
    return routing_table(fakes, version, **endpoint).to_json()


@contextlib.asynccontextmanager
async def running(
    pods: Sequence[FakePod] | int = 2, table: Any = None, config: RouterConfig = FAST, **router_kw: Any
) -> AsyncIterator[tuple[Router, list[FakePod]]]:
    """A router in front of fake pods (static table unless one is given); cleaned up on exit."""
    fake = [await FakePod(f"pod-{i}").start() for i in range(pods)] if isinstance(pods, int) else list(pods)
    router = Router(config, seed=1, **router_kw)
    try:
        if table is None:
            table = static_table([p.url for p in fake], "p2c-mu", 0)
        elif callable(table):
            table = table(fake)
        await router.start("127.0.0.1", 0, StaticDiscovery(table))
        await asyncio.wait_for(router.table_loaded.wait(), 2)
        yield router, fake
    finally:
        await router.shutdown(0.5)
        for p in fake:
            await p.stop()


def cp_table(**endpoint: Any):
    """The table as a router reads it from the control plane."""
    return lambda pods: RoutingTable.from_json(table_doc(pods, **endpoint))


async def call(
    router: Router,
    path: str = "/v1/completions",
    body: Any = None,
    key: str | None = None,
    headers: dict[str, str] | None = None,
    method: str = "POST",
    timeout: float = 5.0,
) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection with our small client."""
    from dataplane.router.upstream import fetch

    h = dict(headers or {})
    if key:
        h["authorization"] = f"Bearer {key}"
    data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else b"")
    if data:
        h.setdefault("content-type", "application/json")
    return await fetch(f"http://127.0.0.1:{router.port}{path}", method, h, data, timeout)


async def scrape(router: Router) -> dict[str, Any]:
    """GET /metrics from loopback, parsed by prometheus_client: family name -> family (a
    counter's family drops the ``_total`` of its samples' name)."""
    from prometheus_client.parser import text_string_to_metric_families

    status, _, body = await call(router, path="/metrics", method="GET")
    assert status == 200, body
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def error_of(body: bytes) -> dict[str, Any]:
    doc = json.loads(body)
    assert set(doc["error"]) >= {"message", "type", "code"}
    return doc["error"]


async def assert_idle(router: Router, timeout: float = 2.0) -> None:
    """Every in-flight counter back to zero (bounded wait for connection teardown)."""
    for _ in range(int(timeout / 0.01)):
        pods = [p for ep in router.endpoints.values() for p in ep.pods]
        if (
            router.state.active_requests == 0
            and router.pool.active == 0
            and all(p.inflight_requests == 0 and p.inflight_mu == 0 for p in pods)
            and all(
                ep.inflight == 0 and ep.queued() == 0 and abs(ep.queued_mu) < 1e-9
                for ep in router.endpoints.values()
            )
            and all(s.inflight == 0 for s in router.meter.totals.values())
        ):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(
        f"router not idle: active={router.state.active_requests} pool={router.pool.active} "
        f"pods={[p for ep in router.endpoints.values() for p in ep.pods]}"
    )


def with_config(**kw: Any) -> RouterConfig:
    return replace(FAST, **kw)


async def wait_until(predicate: Any, timeout: float = 2.0, what: str = "the condition") -> None:
    """Poll ``predicate`` every 10 ms until it holds; fail after ``timeout`` seconds."""
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def raw_post(
    router: Router, body: bytes, limit: int = 2**16, extra: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A POST /v1/completions written by hand on a fresh connection (reader, writer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", router.port, limit=limit)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n%s"
        b"content-length: %d\r\n\r\n%s" % (extra, len(body), body)
    )
    return reader, writer


@pytest.fixture
def decoded(monkeypatch) -> list[int]:
    """The lengths of the base64 runs the image reader decodes, as it decodes them."""
    runs: list[int] = []
    real = wire_images.binascii.a2b_base64

    def counting(chars, strict_mode=False):
        runs.append(len(chars))
        return real(chars, strict_mode=strict_mode)

    monkeypatch.setattr(wire_images.binascii, "a2b_base64", counting)
    return runs
