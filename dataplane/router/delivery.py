"""The router's metered seconds, each kept until its sink acknowledges it.

Once a second ``Router.flush`` adds the second it has just metered (``Delivery.add``: a
``RouterSecond`` with this router's id); ``deliver`` sends what is held, oldest first and one at
a time, and lets a second go only once the sink has acknowledged it, or refused it as malformed
(``SecondRefused``: retrying cannot help; logged and counted). A sink that fails (down, a
timeout, a 5xx) leaves the second held and ends the round; the next round, a second later,
starts from it again. A sink recognises a second it has applied by (router, second) and answers
it as done (``dataplane.wire.load_samples``), so a retry after a lost answer never bills twice.

Held seconds stay in memory up to ``memory_bytes``. With a spool directory (``--spool-dir``)
each second is also written there as it is added, one file per second, 0600 in a 0700
directory (only the router's user reads them), written under a temporary name and renamed (a
file is whole or absent), and removed once acknowledged. So a SIGKILLed router loses at most
the window it was metering (the requests finished in the last second), and a router started
again on the same directory sends what it finds there first, each second under the id it was
metered with. Past ``memory_bytes`` a second is kept only in its file (read back when its turn
comes); past ``spool_bytes`` the oldest are dropped. Without a spool, past ``memory_bytes`` the
oldest are dropped, and a SIGKILL loses every second not yet acknowledged (none while the sink
answers: each is sent within its second) and the window being metered. Every drop is logged
and counted in ``router_metering_seconds_dropped_total``: usage that will not be billed.

32 MiB hold about 9 hours of a router serving 10 endpoints of one tenant (~1 KB a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from dataplane.wire.load_samples import RouterSecond, Sample
from dataplane.wire.prometheus_text import family_header

log = logging.getLogger("dataplane.router")

SUFFIX = ".json"
SECOND_DIGITS = 10  # a unix second up to MAX_SECOND, zero-padded: file names sort by second
# A wall clock this far behind the last second added stepped back (it had run ahead), s; within
# it the seconds go on one past the last (two rolls in one wall second) until the clock catches up
CLOCK_STEP_S = 2


class SinkDown(Exception):
    """The sink did not acknowledge a second (unreachable, a timeout, a 5xx): keep it, retry."""


class SecondRefused(Exception):
    """The sink says a second is malformed (a 400): retrying cannot help."""


class SpoolBusy(Exception):
    """Another router process holds the spool directory."""


Send = Callable[[RouterSecond], Awaitable[None]]


def router_id() -> str:
    """A new id for this router process: its host, pid and 32 random bits, e.g.
    ``router-7d9f-4711-9f2c01ab`` (``load_samples.ROUTER_ID``)."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:48].strip(".-") or "router"
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"


@dataclass(eq=False)  # each is itself: found and let go by identity
class Held:
    """A second not acknowledged yet."""

    router: str  # the id it was metered (and is sent) under
    second: int  # unix second
    size: int  # bytes of its JSON
    body: bytes | None  # its JSON; None: only in its spool file
    path: str | None  # its spool file; None without a spool


class Spool:
    """A directory of held seconds, one file each, ``{second}.{router}.json``; one router
    process at a time holds it (an flock on ``lock``)."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        owner = os.stat(directory).st_uid
        if owner != os.geteuid():  # its owner could add seconds, billed as this router's
            raise PermissionError(
                f"spool directory {directory} belongs to uid {owner}, not to this router's ({os.geteuid()})"
            )
        os.chmod(directory, 0o700)  # one made earlier with a looser mode
        self.directory = directory
        self._lock = os.open(os.path.join(directory, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise SpoolBusy(f"spool directory {directory} is in use by another router process") from None

    def held(self) -> list[Held]:
        """The seconds in the directory, oldest first (on disk only); a temporary file left by
        a kill mid-write is removed. Only regular files are seconds (the router writes no other):
        a link or a directory under a second's name is left alone, never read nor sent."""
        found = []
        for entry in sorted(os.scandir(self.directory), key=lambda e: e.name):
            name, path = entry.name, entry.path
            if not name.endswith((".tmp", SUFFIX)):
                continue
            if not entry.is_file(follow_symlinks=False):
                log.error("%s in the spool is not a file the router wrote: left alone", path)
            elif name.endswith(".tmp"):
                os.unlink(path)
            elif name[:SECOND_DIGITS].isdigit():
                router = name[SECOND_DIGITS + 1 : -len(SUFFIX)]
                size = entry.stat(follow_symlinks=False).st_size
                found.append(Held(router, int(name[:SECOND_DIGITS]), size, None, path))
        return found

    def write(self, router: str, second: int, body: bytes) -> str:
        path = os.path.join(self.directory, f"{second:0{SECOND_DIGITS}d}.{router}{SUFFIX}")
        temporary = path + ".tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temporary, path)
        return path

    @staticmethod
    def read(path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    @staticmethod
    def remove(path: str) -> None:
        """Remove a second's file; one that cannot be (a disk gone read-only) stays and goes
        again at the next start, answered as a duplicate: never an error of the delivery's."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("%s not removed from the spool: %s", path, exc)

    def adopt(self, directory: str) -> int:
        """Move the seconds of another spool directory (one no process holds: a worker index
        past --workers) into this one; returns how many."""
        other = Spool(directory)
        try:
            moved = 0
            for held in other.held():
                assert held.path is not None
                os.replace(held.path, os.path.join(self.directory, os.path.basename(held.path)))
                moved += 1
            return moved
        finally:
            other.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._lock)


class Delivery:
    """This router's seconds not yet acknowledged, oldest first, and the loop that sends them."""

    def __init__(
        self,
        send: Send,
        router: str,
        memory_bytes: int,
        spool: Spool | None = None,
        spool_bytes: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.send = send
        self.router = router
        self.memory_bytes = memory_bytes  # held bodies kept in memory, bytes at most
        self.spool = spool
        self.spool_bytes = spool_bytes  # held seconds' files, bytes at most
        self.clock = clock
        self.held: deque[Held] = deque(spool.held() if spool is not None else ())
        self.in_memory = 0  # bytes of the held bodies in memory
        self.on_disk = sum(h.size for h in self.held)  # bytes of the held seconds' files
        self.last_second = 0  # the last second added: each is later than the one before
        self.delivered = 0  # seconds acknowledged, count
        self.dropped: dict[str, int] = {"memory_full": 0, "spool_full": 0, "refused": 0, "unreadable": 0}
        self.down_since: float | None = None  # clock s of the first failure of this outage
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        if spool is not None and self.held:
            log.warning("%d metered seconds found in %s: sending them first", len(self.held), spool.directory)

    def add(self, samples: Iterable[Sample], wall_second: int) -> None:
        """Hold the second that just ended: ``wall_second``, or the one after the last added
        when the clock has not moved on (two rolls in one second: a shutdown's, a slow tick's),
        so that (router, second) names one window. A clock stepped back further (put right
        after it ran ahead) takes a new router id: its seconds are named by the wall clock again,
        not billed to hours ahead of it, and each new id's seconds increase as a sink expects."""
        if wall_second < self.last_second - CLOCK_STEP_S:
            old, self.router = self.router, router_id()
            log.warning(
                "the clock stepped back %d s: seconds metered from now on go as router %s, not %s",
                self.last_second - wall_second,
                self.router,
                old,
            )
            self.last_second = 0
        second = max(wall_second, self.last_second + 1)
        self.last_second = second
        body = json.dumps(RouterSecond(second, tuple(samples), self.router).to_json()).encode()
        held = Held(self.router, second, len(body), body, None)
        if self.spool is not None:
            try:
                held.path = self.spool.write(self.router, second, body)
            except OSError as exc:  # a full or broken disk: held in memory alone
                log.error("metered second %s not written to the spool: %s", second, exc)
            else:
                self.on_disk += held.size
        if held.path is not None and self.in_memory + held.size > self.memory_bytes:
            held.body = None  # on disk, read back when its turn comes
        else:
            self.in_memory += held.size
        self.held.append(held)
        self._bound()
        self._wake.set()

    def _bound(self) -> None:
        """Drop the oldest seconds past the bounds: those held in memory alone past
        ``memory_bytes`` (no spool, or its write failed), those in the spool past ``spool_bytes``."""
        while self.in_memory > self.memory_bytes:
            self._drop(next(h for h in self.held if h.path is None), "memory_full")
        while self.on_disk > self.spool_bytes:
            self._drop(next(h for h in self.held if h.path is not None), "spool_full")

    def _drop(self, held: Held, reason: str, detail: object = "") -> None:
        log.error(
            "metered second %s of router %s dropped (%s%s): its usage will not be billed",
            held.second,
            held.router,
            reason.replace("_", " "),
            f": {detail}" if detail else "",
        )
        self._let_go(held)
        self.dropped[reason] += 1

    def _let_go(self, held: Held) -> None:
        try:
            self.held.remove(held)  # the oldest but for a drop past a bound
        except ValueError:  # dropped past a bound while it was being sent
            return
        if held.body is not None:
            self.in_memory -= held.size
        if held.path is not None and self.spool is not None:
            self.spool.remove(held.path)
            self.on_disk -= held.size

    async def deliver(self) -> int:
        """Send the held seconds, oldest first, until none is left or the sink fails; returns
        how many were acknowledged."""
        async with self._lock:
            sent = 0
            while self.held:
                held = self.held[0]
                try:
                    body = held.body
                    if body is None:
                        assert held.path is not None
                        body = Spool.read(held.path)
                    posted = RouterSecond.from_json(json.loads(body))
                except (OSError, ValueError) as exc:  # a spool file damaged on disk
                    self._drop(held, "unreadable", exc)
                    continue
                try:
                    await self.send(posted)
                except SecondRefused as exc:
                    self._drop(held, "refused", exc)
                    continue
                except Exception as exc:  # down, a timeout, an error answer: held, tried again
                    if self.down_since is None:
                        self.down_since = self.clock()
                        log.warning(
                            "metering sink failed (%s): holding the seconds until it answers",
                            str(exc) or type(exc).__name__,  # a timeout says nothing
                        )
                    return sent
                self._let_go(held)
                self.delivered += 1
                sent += 1
            if self.down_since is not None:
                log.warning(
                    "metering sink answers again after %.0f s: every held second delivered",
                    self.clock() - self.down_since,
                )
                self.down_since = None
            return sent

    async def run(self, interval_s: float = 1.0) -> None:
        """Deliver whenever a second is added, and at least every ``interval_s``."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval_s)
            self._wake.clear()
            await self.deliver()

    def close(self) -> None:
        """Say what is left behind, and let the spool go."""
        if self.held:
            if self.spool is not None:
                log.warning(
                    "%d metered seconds left in %s for the next start", len(self.held), self.spool.directory
                )
            else:
                log.error("%d metered seconds not delivered and lost (no --spool-dir)", len(self.held))
        if self.spool is not None:
            self.spool.close()

    def metrics_text(self) -> str:
        """Prometheus text of this process's figures (per worker with --workers N)."""
        out = family_header(
            "router_metering_seconds_held", "gauge", "metered seconds not acknowledged by the sink yet"
        )
        out.append(f"router_metering_seconds_held {len(self.held)}")
        out += family_header(
            "router_metering_held_bytes", "gauge", "bytes of those seconds, in memory and on disk"
        )
        out.append(f'router_metering_held_bytes{{where="memory"}} {self.in_memory}')
        out.append(f'router_metering_held_bytes{{where="spool"}} {self.on_disk}')
        out += family_header(
            "router_metering_seconds_delivered_total", "counter", "metered seconds the sink acknowledged"
        )
        out.append(f"router_metering_seconds_delivered_total {self.delivered}")
        out += family_header(
            "router_metering_seconds_dropped_total",
            "counter",
            "metered seconds given up (their usage is not billed), by reason",
        )
        for reason, n in self.dropped.items():
            out.append(f'router_metering_seconds_dropped_total{{reason="{reason}"}} {n}')
        return "\n".join(out) + "\n"
