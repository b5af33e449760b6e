"""The router's side of its conversation with the control plane.

Three exchanges, each failing without harm to the requests in flight (the router keeps serving
with what it has when the control plane is down):
  wake           ``POST /api/v1/endpoints/{id}/wake/`` when a request finds a scaled-to-zero
                 endpoint (the router holds the request meanwhile, see ``admission``);
  load samples   ``POST /api/v1/load-samples/`` once a second with the second's rows
                 (``metering``), when there is no Redis to publish them to;
  routing table  ``follow`` applies each snapshot of a ``Discovery`` as it arrives (the
                 control plane's, polled by ``discovery.ControlPlaneDiscovery``, or a static one).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from dataplane.router.discovery import Discovery
from dataplane.wire.load_samples import RouterSecond, Sample
from dataplane.wire.routing_table import RoutingTable

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

    async def post_samples(self, rows: list[Sample], second: int) -> None:
        body = json.dumps(RouterSecond(second, tuple(rows)).to_json()).encode()
        status, _, answer = await self.fetch(
            f"{self.base_url}/api/v1/load-samples/",
            "POST",
            {"authorization": f"Bearer {self.key}", "content-type": "application/json"},
            body,
            self.timeout_s,
        )
        if status != 201:
            log.warning("load samples answered %s: %s", status, answer[:200])


async def follow(discovery: Discovery, apply: Callable[[RoutingTable], None]) -> None:
    """Apply every routing-table snapshot ``discovery`` yields, for as long as it yields them."""
    async for table in discovery.snapshots():
        apply(table)
