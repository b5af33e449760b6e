"""Routing-table snapshots: what endpoints exist, their pods, keys and limits.

One small interface, ``Discovery``: an async iterator of ``RoutingTable`` snapshots. The router
applies each snapshot as it arrives (in-flight requests keep the pod objects they hold, so a
reload drops nothing). Two sources today:

  StaticDiscovery        a fixed list of backends (benchmarks, single-node use); no API keys.
  ControlPlaneDiscovery  polls ``GET {control_plane}/api/v1/routing-table/`` with the operator's
                         bearer key and ``If-None-Match: <etag>``; 304 = unchanged; a control
                         plane that is down or answers garbage leaves the last good table in use.
                         Given a ``control_plane.TablePush`` that is up, it polls when the push
                         announces a version not its own (and every ``safety_poll_s``) instead.

On Kubernetes, ``endpointslices.EndpointSliceDiscovery`` wraps the control-plane source and
yields the same snapshots with each endpoint's pods taken from its EndpointSlices.

The table's format, shared with the control plane that writes it, is dataplane.wire.routing_table.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from capacity.units import DEFAULT_MAX_MODEL_LEN
from dataplane.router.pricing import CostModel
from dataplane.wire.routing_table import ReservedRate, RoutedEndpoint, RoutedPod, RoutingTable

if TYPE_CHECKING:
    from dataplane.router.control_plane import TablePush

log = logging.getLogger("dataplane.router.discovery")

STATIC_TENANT = ""  # the tenant of static mode: no keys, every request belongs to it
STATIC_ENDPOINT = "*"  # the endpoint name of static mode: matches any model
STATIC_COEFFICIENTS = CostModel(0.002, 0.02, 0.1)  # static mode prices like a 70B chat model


class Discovery(Protocol):
    def snapshots(self) -> AsyncIterator[RoutingTable]: ...


def static_table(
    backends: Sequence[str],
    policy: str,
    target_concurrency: int,
    rate_limit_mu_per_min: float | None = None,
    coefficients: CostModel = STATIC_COEFFICIENTS,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
) -> RoutingTable:
    """One endpoint that takes any model name; pods named by their URLs; output budgets above
    ``max_model_len`` (the pods' context length, tokens) refused."""
    reservation = (
        ReservedRate(rate_limit_mu_per_min, best_effort_allowed=False) if rate_limit_mu_per_min else None
    )
    ep = RoutedEndpoint(
        id=0,
        tenant=STATIC_TENANT,
        name=STATIC_ENDPOINT,
        model=STATIC_ENDPOINT,
        policy=policy,
        coefficients=coefficients,
        mu_per_replica_minute=0.0,  # unknown capacity: best effort never sheds
        target_concurrency=target_concurrency,
        scale_to_zero_enabled=False,
        reservation=reservation,
        pods=tuple(RoutedPod(url, url, True) for url in backends),
        max_model_len=max_model_len,
    )
    return RoutingTable("static", (ep,), {}, auth_required=False)


class StaticDiscovery:
    def __init__(self, table: RoutingTable) -> None:
        self.table = table

    async def snapshots(self) -> AsyncIterator[RoutingTable]:
        yield self.table


Fetch = Callable[..., Any]
JITTER = 0.2  # each poll waits poll_interval_s x (1 +- JITTER)


class ControlPlaneDiscovery:
    """Poll the control plane; yield a table when it changes; keep the last good one otherwise."""

    def __init__(
        self,
        base_url: str,
        key: str,
        fetch: Fetch,
        poll_interval_s: float = 1.0,
        timeout_s: float = 5.0,
        max_polls: int | None = None,
        on_confirmed: Callable[[], None] | None = None,
        push: TablePush | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/api/v1/routing-table/"
        self.key = key
        self.fetch = fetch  # upstream.fetch or a fake
        self.poll_interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self.max_polls = max_polls  # bound for tests; None = for the life of the router
        # Called on every answer that confirms the table in use (a new one, or a 304): the
        # router's measure of how stale its keys may be (control_plane.TableFreshness).
        self.on_confirmed = on_confirmed
        self.push = push
        self.etag: str | None = None
        self.failures = 0  # polls in a row that got no usable answer, count
        self._rng = random.Random()
        self._chased: str | None = None  # the announced version last polled for at once

    async def poll_once(self) -> RoutingTable | None:
        """A new table, or None (unchanged, unreachable or garbage: keep the last good one)."""
        headers = {"authorization": f"Bearer {self.key}", "accept": "application/json"}
        if self.etag:
            headers["if-none-match"] = self.etag
        try:
            status, resp_headers, body = await self.fetch(self.url, "GET", headers, b"", self.timeout_s)
        except (OSError, ConnectionError, TimeoutError, ValueError) as exc:
            self.failures += 1
            log.warning("control plane unreachable (%s); keeping routing table %s", exc, self.etag)
            return None
        if status == 304:
            self.failures = 0
            if self.on_confirmed is not None:
                self.on_confirmed()
            return None
        if status != 200:
            self.failures += 1
            log.warning("control plane answered %s; keeping routing table %s", status, self.etag)
            return None
        try:
            table = RoutingTable.from_json(json.loads(body))
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            self.failures += 1
            log.warning("bad routing table (%s); keeping %s", exc, self.etag)
            return None
        self.failures = 0
        self.etag = resp_headers.get("etag") or table.version
        if self.on_confirmed is not None:
            self.on_confirmed()
        return table

    @property
    def max_poll_gap_s(self) -> float:
        """The longest wait between two polls: a change (a revoked key) reaches the router
        within this and one poll's time."""
        return self.poll_interval_s * (1 + JITTER)

    async def snapshots(self) -> AsyncIterator[RoutingTable]:
        listening = None if self.push is None else asyncio.create_task(self.push.run())
        try:
            polls = 0
            while self.max_polls is None or polls < self.max_polls:
                polls += 1
                table = await self.poll_once()
                if table is not None:
                    yield table
                await self._until_next_poll()
        finally:
            if listening is not None:
                listening.cancel()

    def _jittered(self, seconds: float) -> float:
        # jittered so that a fleet of routers does not poll in lockstep
        return seconds * (1 - JITTER + 2 * JITTER * self._rng.random())

    async def _until_next_poll(self) -> None:
        """poll_interval_s; or, while the push is up, until it announces a version not ours
        (at once the first time, then every poll_interval_s while ours still differs: a web
        worker may serve the older table for a moment) or safety_poll_s have passed."""
        push = self.push
        if push is None:
            await asyncio.sleep(self._jittered(self.poll_interval_s))
            return
        start = push.clock()
        interval, safety = self._jittered(self.poll_interval_s), self._jittered(push.safety_poll_s)
        while True:
            now = push.clock()
            ours = (self.etag or "").strip('"')
            if not push.up(now):
                due = start + interval
            elif push.version is not None and push.version != ours:
                if push.version != self._chased:
                    self._chased = push.version
                    return
                due = start + interval
            else:
                due = start + safety
                # the control plane announced our version: as good as a 304 for freshness
                if self.on_confirmed is not None:
                    self.on_confirmed()
            if now >= due:
                return
            push.changed.clear()
            # woken by an announcement of a new version, or to look again whether the push
            # has gone silent (then the plain interval applies)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(push.changed.wait(), min(due - now, push.silence_s))
