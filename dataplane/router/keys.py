"""Which tenant a bearer key belongs to, as the router learns it: the routing table no longer
carries every active key (dataplane.wire.routing_table), so a key the router has not seen is
looked up by its SHA-256 at the control plane, once, and the answer kept.

What holds:
  a new key     works at its first request (one lookup; a miss is kept only ``unknown_ttl_s``);
  a revoked key refused from the first table after it (within a poll): the revocation raised its
                tenant's epoch there, so the router drops every answer it kept for that tenant
                under an older epoch and looks each up again (at most the tenant's cap of keys);
  an outage     the control plane down: known keys keep working (``TableFreshness`` still
                bounds how long), an unknown one is refused (503, never let in);
  a flood       random bearer tokens cost at most ``lookups_per_s`` lookups a second (a bucket
                of ``lookup_burst``) and one at a time per digest; past it 503 + Retry-After;
                after a failed lookup none for ``down_backoff_s``; memory bounded by
                ``max_known`` and ``max_unknown`` entries (the least recently used go first).

The tenant found is what per-tenant limits, metering and the shared limiter use, as before.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from dataplane.router.http import RequestError
from dataplane.wire.routing_table import KeyEpoch, KeyLookup, RoutingTable

Lookup = Callable[[str], Awaitable[KeyLookup]]  # raises OSError/TimeoutError/ValueError when it cannot tell

RETRY = b"retry-after: 1\r\n"


def refused() -> RequestError:
    return RequestError(401, "invalid or revoked API key", "invalid_api_key")


class KeyBook:
    """The keys this router process knows, the ones it knows to be unknown, and its lookups."""

    def __init__(
        self,
        lookup: Lookup | None,
        clock: Callable[[], float],
        lookups_per_s: float = 20.0,
        lookup_burst: int = 50,
        unknown_ttl_s: float = 5.0,
        down_backoff_s: float = 1.0,
        max_known: int = 100_000,
        max_unknown: int = 10_000,
    ) -> None:
        self.lookup = lookup  # None: no control plane to ask (static mode, or keys in the table)
        self.clock = clock  # monotonic s
        self.lookups_per_s = lookups_per_s
        self.lookup_burst = lookup_burst
        self.unknown_ttl_s = unknown_ttl_s
        self.down_backoff_s = down_backoff_s
        self.max_known = max_known
        self.max_unknown = max_unknown
        self.table: RoutingTable | None = None
        self.known: OrderedDict[str, tuple[str, KeyEpoch]] = OrderedDict()  # digest -> tenant, epoch
        self.unknown: OrderedDict[str, float] = OrderedDict()  # digest -> clock s it expires
        self.pending: dict[str, asyncio.Future[KeyLookup]] = {}  # lookups in flight, by digest
        self.tokens = float(lookup_burst)
        self.filled_at = clock()
        self.down_until = 0.0  # no lookup before this clock s (the last one failed)
        self.lookups = 0  # made, count
        self.unavailable = 0  # requests refused (503): the bucket, the backoff, a failed lookup

    def apply(self, table: RoutingTable) -> None:
        """A new table: forget the answers it makes out of date (their tenant's epoch moved)."""
        self.table = table
        for digest in [d for d, (tenant, epoch) in self.known.items() if self._outdated(tenant, epoch)]:
            del self.known[digest]

    def _outdated(self, tenant: str, epoch: KeyEpoch) -> bool:
        """Whether an answer under ``epoch`` may have been revoked since, by the table in use: its
        tenant gone or made again (another id), or more of its keys revoked than it counted."""
        if self.table is None:
            return False
        now = self.table.key_epochs.get(tenant)
        return now is None or now.tenant_id != epoch.tenant_id or now.revoked > epoch.revoked

    async def tenant(self, digest: str) -> str:
        """The tenant of the key with this digest, or RequestError: 401 when it is not a key
        (or a revoked one), 503 + Retry-After when it cannot be checked now."""
        try:
            return await self._tenant(digest)
        except RequestError as exc:
            self.unavailable += exc.status == 503
            raise

    async def _tenant(self, digest: str) -> str:
        table = self.table
        if table is not None and (listed := table.api_keys.get(digest)) is not None:
            return listed
        if (known := self.known.get(digest)) is not None:
            self.known.move_to_end(digest)
            return known[0]
        if (expires := self.unknown.get(digest)) is not None:
            if self.clock() < expires:
                raise refused()
            del self.unknown[digest]
        if self.lookup is None:
            raise refused()
        # A second lookup when the first read an epoch older than the table's: that tenant
        # revoked a key meanwhile (its snapshot then is at least the table's)
        for _ in range(2):
            found = await self._looked_up(digest)
            if found.tenant is None or found.epoch is None:
                raise refused()
            if not self._outdated(found.tenant, found.epoch) or (
                self.table is not None and found.tenant not in self.table.key_epochs
            ):  # a tenant newer than the table: nothing of it can be revoked there
                self._keep(found.digest, found.tenant, found.epoch)
                return found.tenant
        raise RequestError(
            503, "the API key cannot be checked now: its tenant's keys are changing; retry",
            "key_check_unavailable", RETRY,
        )  # fmt: skip

    async def _looked_up(self, digest: str) -> KeyLookup:
        """One lookup of ``digest``, shared by every request that asks while it is in flight."""
        pending = self.pending.get(digest)
        if pending is not None:
            return await asyncio.shield(pending)
        self._spend(self.clock())
        pending = asyncio.get_running_loop().create_future()
        self.pending[digest] = pending
        try:
            found = await self.lookup(digest)  # type: ignore[misc]  # tenant() checked it is set
        except (OSError, ConnectionError, TimeoutError, ValueError) as exc:
            self.down_until = self.clock() + self.down_backoff_s
            error = RequestError(
                503, f"the API key cannot be checked now: the control plane did not answer ({exc})",
                "key_check_unavailable", RETRY,
            )  # fmt: skip
            pending.set_exception(error)
            pending.exception()  # retrieved: no "never retrieved" warning when no one waited
            raise error from None
        finally:
            del self.pending[digest]
        pending.set_result(found)
        if found.tenant is None:
            self.unknown[digest] = self.clock() + self.unknown_ttl_s
            self.unknown.move_to_end(digest)
            while len(self.unknown) > self.max_unknown:
                self.unknown.popitem(last=False)
        return found

    def _spend(self, now: float) -> None:
        """Take one lookup from the bucket, or refuse the request: 503 while the control plane
        is backing off or the bucket is empty (a flood of keys no one knows)."""
        if now < self.down_until:
            raise RequestError(
                503, "the API key cannot be checked now: the control plane did not answer; retry",
                "key_check_unavailable", RETRY,
            )  # fmt: skip
        self.tokens = min(float(self.lookup_burst), self.tokens + (now - self.filled_at) * self.lookups_per_s)
        self.filled_at = now
        if self.tokens < 1.0:
            raise RequestError(
                503, "too many unknown API keys to check at once; retry", "key_checks_throttled", RETRY
            )
        self.tokens -= 1.0
        self.lookups += 1

    def _keep(self, digest: str, tenant: str, epoch: KeyEpoch) -> None:
        self.known[digest] = (tenant, epoch)
        self.known.move_to_end(digest)
        while len(self.known) > self.max_known:
            self.known.popitem(last=False)

    def metrics_text(self) -> str:
        """Prometheus text of this process's key figures (per worker with --workers N)."""
        from dataplane.wire.prometheus_text import family_header

        out = family_header("router_api_keys_known", "gauge", "API keys this process knows the tenant of")
        out.append(f"router_api_keys_known {len(self.known)}")
        out += family_header(
            "router_api_key_lookups_total", "counter", "API keys looked up at the control plane"
        )
        out.append(f"router_api_key_lookups_total {self.lookups}")
        out += family_header(
            "router_api_key_checks_unavailable_total",
            "counter",
            "requests refused (503) because their key could not be checked: the lookups' bucket"
            " empty, a backoff after a failed lookup, or a failed lookup",
        )
        out.append(f"router_api_key_checks_unavailable_total {self.unavailable}")
        return "\n".join(out) + "\n"
