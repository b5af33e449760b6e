"""The router's key book on its own, its lookup a coroutine that counts and answers what a
control plane would, on a clock the test moves: one lookup per key however many requests wait
on it, answers dropped when their tenant's epoch moves, memory bounded, misses kept briefly."""

from __future__ import annotations

import asyncio

import pytest

from dataplane.router.http import RequestError
from dataplane.router.keys import KeyBook
from dataplane.wire.routing_table import KeyEpoch, KeyLookup, RoutingTable


def digest(i: int) -> str:
    return f"{i:064x}"


class ControlPlane:
    """Which tenant each digest belongs to and each tenant's epoch, as the database says."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}
        self.epochs: dict[str, KeyEpoch] = {}
        self.asked: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def lookup(self, d: str) -> KeyLookup:
        self.asked.append(d)
        await self.gate.wait()
        tenant = self.keys.get(d)
        return KeyLookup(d, tenant, None if tenant is None else self.epochs[tenant])

    def table(self) -> RoutingTable:
        return RoutingTable.versioned((), {}, dict(self.epochs))


def book(cp: ControlPlane, now: list[float], **kw) -> KeyBook:
    keys = KeyBook(cp.lookup, lambda: now[0], **kw)
    keys.apply(cp.table())
    return keys


def test_requests_waiting_on_one_key_share_one_lookup():
    cp, now = ControlPlane(), [0.0]
    cp.epochs["acme"] = KeyEpoch(1, 0)
    cp.keys[digest(1)] = "acme"
    keys = book(cp, now)

    async def go() -> list[str]:
        cp.gate.clear()
        waiting = [asyncio.ensure_future(keys.tenant(digest(1))) for _ in range(20)]
        await asyncio.sleep(0)
        cp.gate.set()
        return await asyncio.gather(*waiting)

    assert asyncio.run(go()) == ["acme"] * 20 and cp.asked == [digest(1)]


def test_a_revocation_drops_the_tenant_s_kept_keys_and_only_theirs():
    cp, now = ControlPlane(), [0.0]
    cp.epochs.update(acme=KeyEpoch(1, 0), globex=KeyEpoch(2, 0))
    cp.keys.update({digest(1): "acme", digest(2): "acme", digest(3): "globex"})
    keys = book(cp, now)

    async def go() -> None:
        for i in (1, 2, 3):
            await keys.tenant(digest(i))
        del cp.keys[digest(1)]  # revoked
        cp.epochs["acme"] = KeyEpoch(1, 1)
        keys.apply(cp.table())
        assert set(keys.known) == {digest(3)}
        with pytest.raises(RequestError) as refused:
            await keys.tenant(digest(1))
        assert refused.value.status == 401
        assert await keys.tenant(digest(2)) == "acme"  # looked up again
        # a tenant deleted and made again under its name: another id
        cp.epochs["globex"] = KeyEpoch(9, 0)
        keys.apply(cp.table())
        assert digest(3) not in keys.known

    asyncio.run(go())
    assert cp.asked == [digest(1), digest(2), digest(3), digest(1), digest(2)]


def test_an_answer_older_than_the_table_is_asked_again():
    cp, now = ControlPlane(), [0.0]
    cp.epochs["acme"] = KeyEpoch(1, 3)  # the table has seen 3 revocations
    cp.keys[digest(1)] = "acme"
    keys = book(cp, now)
    stale = [KeyEpoch(1, 2), KeyEpoch(1, 3)]  # the first lookup read before the third

    async def lookup(d: str) -> KeyLookup:
        cp.asked.append(d)
        return KeyLookup(d, "acme", stale.pop(0))

    keys.lookup = lookup
    assert asyncio.run(keys.tenant(digest(1))) == "acme" and len(cp.asked) == 2


def test_misses_are_kept_briefly_and_memory_is_bounded():
    cp, now = ControlPlane(), [0.0]
    cp.epochs["acme"] = KeyEpoch(1, 0)
    for i in range(10):
        cp.keys[digest(i)] = "acme"
    keys = book(cp, now, max_known=4, max_unknown=3, unknown_ttl_s=5.0, lookup_burst=100)

    async def go() -> None:
        for i in range(10):
            await keys.tenant(digest(i))
        for i in range(100, 110):
            with pytest.raises(RequestError):
                await keys.tenant(digest(i))
        with pytest.raises(RequestError):
            await keys.tenant(digest(109))  # kept: no lookup
        asked = len(cp.asked)
        now[0] = 5.0
        with pytest.raises(RequestError):
            await keys.tenant(digest(109))  # its time is up: asked again
        assert len(cp.asked) == asked + 1

    asyncio.run(go())
    assert len(keys.known) == 4 and len(keys.unknown) == 3
    assert set(keys.known) == {digest(i) for i in range(6, 10)}  # the most recently used


def test_the_bucket_refills_at_its_rate():
    cp, now = ControlPlane(), [0.0]
    keys = book(cp, now, lookups_per_s=2.0, lookup_burst=3)

    async def status(i: int) -> int:
        try:
            await keys.tenant(digest(i))
        except RequestError as exc:
            return exc.status
        return 200

    async def go() -> list[int]:
        first = [await status(i) for i in range(5)]
        now[0] = 1.0  # two more
        return first + [await status(i) for i in range(5, 8)]

    assert asyncio.run(go()) == [401, 401, 401, 503, 503, 401, 401, 503]
    assert keys.lookups == 5 and keys.unavailable == 3
