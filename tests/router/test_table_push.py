"""Routing-table changes pushed over Redis: a router subscribed to the control plane's
announcements polls when one names a version not its own, not every second; with the push down
(Redis unreachable, or nobody announcing) it polls every interval as before. Real sockets: the
stand-in control plane over HTTP, a real Redis for the announcements."""

import asyncio
import contextlib
import os
import time

import pytest
from redis.asyncio import Redis

from dataplane.router.control_plane import TablePush
from dataplane.router.discovery import ControlPlaneDiscovery
from dataplane.router.upstream import fetch
from dataplane.wire.routing_table import channel
from tests.router.conftest import free_port, table_doc, wait_until
from tests.router.test_control_plane_discovery import StandInControlPlane

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")


async def announce_forever(redis: Redis, cp: StandInControlPlane, every_s: float) -> None:
    """The control plane's publishing task: the current version, every ``every_s``."""
    while True:
        await redis.publish(channel(redis), cp.doc["version"])
        await asyncio.sleep(every_s)


async def next_table(snapshots, timeout: float):
    return await asyncio.wait_for(anext(snapshots), timeout)


async def stop(waiting: asyncio.Task | None, snapshots) -> None:
    """End a test's discovery: the task waiting on it first, then the generator (and its push)."""
    if waiting is not None and not waiting.done():
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
    await snapshots.aclose()


def test_a_change_reaches_the_router_at_once_while_polls_stay_rare():
    async def go():
        redis = Redis.from_url(REDIS_URL)
        cp = await StandInControlPlane().start()
        cp.doc = table_doc([], version="v1")
        announcing = asyncio.create_task(announce_forever(redis, cp, 0.1))
        # A 30 s poll interval: only the push can bring a change within the test.
        push = TablePush(REDIS_URL, safety_poll_s=30.0, silence_s=0.2)
        confirmed: list[float] = []
        d = ControlPlaneDiscovery(
            cp.url,
            "op-key",
            fetch,
            poll_interval_s=30.0,
            timeout_s=1,
            push=push,
            on_confirmed=lambda: confirmed.append(time.monotonic()),
        )
        snapshots = d.snapshots()
        waiting = None
        try:
            assert (await next_table(snapshots, 5)).version == "v1"
            waiting = asyncio.create_task(next_table(snapshots, 10))
            # announcements of v1, the router's own: each confirms the table as a 304 would
            # (the router's freshness), and none makes it poll
            await wait_until(lambda: len(confirmed) >= 3, 5, "three confirmations")
            assert len(cp.requests) == 1 and push.up(time.monotonic())
            cp.doc = table_doc([], version="v2")
            changed = time.monotonic()
            assert (await waiting).version == "v2"
            # an announcement (every 0.1 s) and one poll; the 30 s poll interval would be 30 s
            assert time.monotonic() - changed < 2.0
            assert len(cp.requests) == 2
        finally:
            await stop(waiting, snapshots)
            announcing.cancel()
            await cp.stop()
            await redis.aclose()

    asyncio.run(go())


def test_with_the_push_down_the_router_polls_every_interval():
    async def go():
        cp = await StandInControlPlane().start()
        cp.doc = table_doc([], version="v1")
        # Redis unreachable: no announcement ever comes, so the push is never up.
        push = TablePush(f"redis://127.0.0.1:{free_port()}/0", safety_poll_s=30.0, silence_s=0.5, retry_s=0.1)
        d = ControlPlaneDiscovery(cp.url, "op-key", fetch, poll_interval_s=0.1, timeout_s=1, push=push)
        snapshots = d.snapshots()
        waiting = None
        try:
            assert (await next_table(snapshots, 5)).version == "v1"
            cp.doc = table_doc([], version="v2")
            assert (await next_table(snapshots, 5)).version == "v2"
            assert not push.up(time.monotonic())
            waiting = asyncio.create_task(next_table(snapshots, 10))  # 304s from here on
            polled = len(cp.requests)
            await wait_until(lambda: len(cp.requests) >= polled + 3, 5, "polls every 0.1 s")
        finally:
            await stop(waiting, snapshots)
            await cp.stop()

    asyncio.run(go())


def test_announcements_that_stop_leave_the_router_polling_every_interval():
    async def go():
        redis = Redis.from_url(REDIS_URL)
        cp = await StandInControlPlane().start()
        cp.doc = table_doc([], version="v1")
        announcing = asyncio.create_task(announce_forever(redis, cp, 0.1))
        # silent for 1.5 s means down: 15 announcements' worth, so a loaded machine's stall is not
        push = TablePush(REDIS_URL, safety_poll_s=30.0, silence_s=1.5)
        d = ControlPlaneDiscovery(cp.url, "op-key", fetch, poll_interval_s=0.2, timeout_s=1, push=push)
        snapshots = d.snapshots()
        waiting = None
        try:
            assert (await next_table(snapshots, 5)).version == "v1"
            waiting = asyncio.create_task(next_table(snapshots, 10))
            await wait_until(lambda: push.up(time.monotonic()), 5, "the push up")
            await asyncio.sleep(0.6)  # 3 polls' worth of the 0.2 s interval...
            assert len(cp.requests) == 1  # ...and none: the announcements are of our version
            announcing.cancel()  # the control plane's publishing task stops; Redis stays up
            # silent past 1.5 s: polls every 0.2 s again (the push's 30 s would bring none). The
            # first poll may come 3 s after the last announcement (1.5 s of silence, then a wait
            # of up to 1.5 s that began before it), then 7 more at 0.2 s: ~4.4 s, where polls at
            # the silence's 1.5 s would take 13.5 s. 10 s leaves a loaded machine's stalls room
            # (3 polls in 5 s failed once in CI beside a vLLM build).
            await wait_until(lambda: len(cp.requests) >= 8, 10, "polls every interval")
            assert not push.up(time.monotonic())
            cp.doc = table_doc([], version="v2")  # ...which bring a change without any push
            assert (await waiting).version == "v2"
        finally:
            await stop(waiting, snapshots)
            announcing.cancel()
            await cp.stop()
            await redis.aclose()

    asyncio.run(go())


@pytest.mark.parametrize("announced", ["v1", "v2"])
def test_heard_sets_changed_only_for_a_new_version(announced):
    now = [100.0]
    push = TablePush(REDIS_URL, silence_s=3.0, clock=lambda: now[0])
    assert not push.up(now[0])
    push.heard("v1", now[0])
    push.changed.clear()
    push.heard(announced, 101.0)
    assert push.changed.is_set() == (announced != "v1") and push.version == announced
    assert push.up(104.0) and not push.up(104.5)  # 3 s after the last announcement it is down


def test_each_database_of_a_server_has_its_own_announcements():
    # Pub/sub is server-wide: without the database in the name, a control plane on db 0 would
    # make the routers of one on db 3 poll at every one of its builds.
    a, b = Redis.from_url("redis://127.0.0.1:6379/0"), Redis.from_url("redis://127.0.0.1:6379/3")
    assert channel(a) == "routing-table:version:0" and channel(b) == "routing-table:version:3"
