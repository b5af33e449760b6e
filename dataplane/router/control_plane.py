"""The router's side of its conversation with the control plane.

Four exchanges, each failing without harm to the requests in flight (the router keeps serving
with what it has when the control plane is down):
  wake           ``POST /api/v1/endpoints/{id}/wake/`` when a request finds a scaled-to-zero
                 endpoint (the router holds the request meanwhile, see ``admission``);
  load samples   ``POST /api/v1/load-samples/`` with each second's rows (``metering``), when
                 there is no Redis to publish them to: ``delivery`` holds a second until a
                 post of it is answered 201 (stored) or 200 (a duplicate, stored before);
  key lookups    ``GET /api/v1/routing-table/keys/{sha256}/`` for a bearer key the router does
                 not know (``keys.KeyBook``, which bounds them);
  routing table  ``follow`` applies each snapshot of a ``Discovery`` as it arrives (the
                 control plane's, polled by ``discovery.ControlPlaneDiscovery``, or a static one);
                 with ``--redis``, ``TablePush`` hears the control plane announce its table's
                 version about once a second, and the router polls only when it changes;
                 ``TableFreshness`` refuses keys from a table the control plane has not
                 confirmed for longer than a bound (or, fail-open, serves and counts them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from dataplane.router.delivery import SecondRefused, SinkDown
from dataplane.router.discovery import Discovery
from dataplane.router.http import RequestError
from dataplane.wire.load_samples import RouterSecond
from dataplane.wire.prometheus_text import family_header
from dataplane.wire.routing_table import KeyLookup, RoutingTable, channel

log = logging.getLogger("dataplane.router")

Fetch = Callable[..., Awaitable[tuple[int, dict[str, str], bytes]]]  # upstream.fetch or a fake


class ControlPlaneClient:
    """Calls to the control plane at ``base_url``, authenticated with the operator's key."""

    def __init__(self, base_url: str, key: str | None, fetch: Fetch, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.fetch = fetch
        self.timeout_s = timeout_s  # one call, s

    async def wake(self, endpoint_id: int) -> None:
        url = f"{self.base_url}/api/v1/endpoints/{endpoint_id}/wake/"
        try:
            status, _, _ = await self.fetch(
                url, "POST", {"authorization": f"Bearer {self.key}"}, b"", self.timeout_s
            )
            if status not in (200, 202, 204, 404):
                log.warning("wake %s answered %s", endpoint_id, status)
        except (OSError, TimeoutError, ConnectionError) as exc:
            log.warning("wake %s failed: %s", endpoint_id, exc)

    async def lookup_key(self, digest: str) -> KeyLookup:
        """The tenant of the key with this SHA-256 (``keys.KeyBook``'s lookup): 200 with it, 404
        with none; ValueError for any other answer, OSError/TimeoutError as they come."""
        status, _, answer = await self.fetch(
            f"{self.base_url}/api/v1/routing-table/keys/{digest}/",
            "GET",
            {"authorization": f"Bearer {self.key}", "accept": "application/json"},
            b"",
            self.timeout_s,
        )
        if status == 404:
            return KeyLookup(digest, None, None)
        if status != 200:
            raise ValueError(f"key lookup answered {status}: {answer[:200]!r}")
        found = KeyLookup.from_json(json.loads(answer))
        if found.digest != digest or found.tenant is None:
            raise ValueError(f"key lookup answered 200 for another question: {answer[:200]!r}")
        return found

    async def post_samples(self, posted: RouterSecond) -> None:
        """Deliver one second (``delivery.Send``): SecondRefused when the control plane says it is
        malformed (400, 413), SinkDown for any other answer but 200 and 201; a failure to
        connect or a timeout raises as it comes."""
        status, _, answer = await self.fetch(
            f"{self.base_url}/api/v1/load-samples/",
            "POST",
            {"authorization": f"Bearer {self.key}", "content-type": "application/json"},
            json.dumps(posted.to_json()).encode(),
            self.timeout_s,
        )
        if status in (400, 413):
            raise SecondRefused(f"load samples answered {status}: {answer[:200]!r}")
        if status not in (200, 201):  # 401/403 too: a key to fix, not a second to give up
            raise SinkDown(f"load samples answered {status}: {answer[:200]!r}")


async def follow(discovery: Discovery, apply: Callable[[RoutingTable], None]) -> None:
    """Apply every routing-table snapshot ``discovery`` yields, for as long as it yields them."""
    async for table in discovery.snapshots():
        apply(table)


class TablePush:
    """The control plane's announcements of its routing table's version, over Redis pub/sub
    (``channel``, one per table it builds, about one a second). While they come the router polls
    when one names a version not its own, and otherwise only every ``safety_poll_s``; after
    ``silence_s`` without one (Redis down, or the control plane's publishing task) the push is
    down and the router polls every ``poll_interval_s``, as it does without Redis. (The
    announcements themselves confirm the table: its version is a hash of its content, so the
    safety poll only bounds how long a lost message could go unnoticed.)

    1,000 routers then poll 1,000 / 60 s = 17 times a second, not 1,000, plus once each per change
    (bench/routing_table_fanout.py: 4-5 ms of a web worker's CPU per 304, whatever the table's size).
    """

    def __init__(
        self,
        redis_url: str,
        safety_poll_s: float = 60.0,
        silence_s: float = 3.0,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis_url = redis_url
        self.safety_poll_s = safety_poll_s  # polls while the push is up, s apart at most
        self.silence_s = silence_s  # no announcement for this long: the push is down, s
        self.retry_s = retry_s  # between attempts to subscribe again, s
        self.clock = clock
        self.version: str | None = None  # the last version announced
        self.heard_at: float | None = None  # clock s of the last announcement
        self.changed = asyncio.Event()  # set when an announcement names a new version
        self._down_logged = False

    def up(self, now: float) -> bool:
        return self.heard_at is not None and now - self.heard_at <= self.silence_s

    def heard(self, version: str, now: float) -> None:
        if self._down_logged:
            log.warning("routing-table announcements heard again: polling on change")
            self._down_logged = False
        self.heard_at = now
        if version != self.version:
            self.version = version
            self.changed.set()

    async def run(self) -> None:
        """Listen for as long as the router runs, subscribing again after every failure."""
        from redis.asyncio import Redis
        from redis.exceptions import RedisError

        while True:
            client = Redis.from_url(self.redis_url, socket_connect_timeout=1.0)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(channel(client))
                while True:
                    message = await pubsub.get_message(timeout=self.silence_s)
                    if message is not None and message["type"] == "message":
                        self.heard(message["data"].decode(), self.clock())
            except (OSError, RedisError, UnicodeDecodeError) as exc:
                if not self._down_logged:
                    log.warning("routing-table announcements lost (%s): polling every interval", exc)
                    self._down_logged = True
            finally:
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2
                await client.aclose()
            await asyncio.sleep(self.retry_s)


class TableFreshness:
    """How long ago the control plane last confirmed the routing table, and what keys from it are
    worth past ``stale_after_s``. A revoked key stays in a table the router cannot refresh, so
    past the bound a tenant request is refused (503), or with ``fail_open`` served, logged and
    counted. Never confirmed (static mode, or a router whose discovery does not report): never
    stale. Time is passed in: ``now`` on the router's clock, ``wall_now`` for the message."""

    def __init__(self, stale_after_s: float, fail_open: bool) -> None:
        self.stale_after_s = stale_after_s  # 0: never stale
        self.fail_open = fail_open
        self.confirmed_at: float | None = None  # router clock, s
        self.served_stale = 0  # tenant requests served on a stale table (fail-open), count
        self.refused_stale = 0  # ... refused (fail-closed), count
        self._stale_since: float | None = None  # confirmed_at of the stale spell logged, if any

    def confirm(self, now: float) -> None:
        if self._stale_since is not None:
            log.warning("routing table confirmed again after %.0f s", now - self._stale_since)
            self._stale_since = None
        self.confirmed_at = now

    def age_s(self, now: float) -> float | None:
        return None if self.confirmed_at is None else now - self.confirmed_at

    def check(self, now: float, wall_now: float) -> None:
        """Let a tenant request through, or refuse it: 503 past the bound unless fail-open."""
        age = self.age_s(now)
        if age is None or not self.stale_after_s or age <= self.stale_after_s:
            return
        since = datetime.fromtimestamp(wall_now - age, UTC).isoformat(timespec="seconds")
        if self._stale_since is None:
            self._stale_since = self.confirmed_at
            log.warning(
                "routing table stale since %s (%.0f s, bound %.0f s): %s",
                since,
                age,
                self.stale_after_s,
                "serving its keys (fail-open)" if self.fail_open else "refusing tenant requests",
            )
        if self.fail_open:
            self.served_stale += 1
            return
        self.refused_stale += 1
        raise RequestError(
            503,
            f"routing table stale since {since}: the control plane has not confirmed it for "
            f"{age:.0f} s (bound {self.stale_after_s:.0f} s), so API keys cannot be checked",
            "routing_table_stale",
            b"retry-after: 5\r\n",
        )

    def metrics_text(self, now: float) -> str:
        """Prometheus text of this process's figures (per worker with --workers N)."""
        age = self.age_s(now)
        out = family_header(
            "router_routing_table_age_seconds",
            "gauge",
            "seconds since the control plane last confirmed the routing table (-1: never)",
        )
        out.append(f"router_routing_table_age_seconds {-1 if age is None else round(age, 3)}")
        out += family_header(
            "router_stale_table_requests_total",
            "counter",
            "tenant requests that found the routing table stale",
        )
        out.append(f'router_stale_table_requests_total{{outcome="served"}} {self.served_stale}')
        out.append(f'router_stale_table_requests_total{{outcome="refused"}} {self.refused_stale}')
        return "\n".join(out) + "\n"
