"""``--workers N``: a pod is ready only when every worker has its routing table. The workers
share the port (SO_REUSEPORT), so a readiness probe reaches any one of them; here the stand-in
control plane gives the table to one worker's first poll and refuses every other poll until
released, and no probe answers 200 before the second worker has the table too."""

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from dataplane.router.upstream import fetch
from tests.router.conftest import free_port, table_doc

pytestmark = pytest.mark.stack  # a router's workers as subprocesses


class OneTableThenRefusals:
    """GET /api/v1/routing-table/: the table once, then 503 until ``released``."""

    def __init__(self) -> None:
        self.body = json.dumps(table_doc([], version="v1")).encode()
        self.answered = 0  # tables served
        self.polls = 0
        self.released = False

    async def conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.polls += 1
            if self.answered and not self.released:
                writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
            else:
                self.answered += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\netag: v1\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(self.body), self.body)
                )
            await writer.drain()
        finally:
            writer.close()


async def health(port: int) -> list[int]:
    """/health on 24 fresh connections: the kernel spreads them over the workers."""
    statuses = []
    for _ in range(24):
        try:
            statuses.append((await fetch(f"http://127.0.0.1:{port}/health", timeout_s=2))[0])
        except OSError:
            statuses.append(0)  # not listening yet
    return statuses


def test_no_worker_says_ready_before_every_worker_has_its_table():
    async def go() -> None:
        cp = OneTableThenRefusals()
        server = await asyncio.start_server(cp.conn, "127.0.0.1", 0)
        cp_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        port = free_port()
        command = [sys.executable, "-m", "dataplane.router", "--listen", f"127.0.0.1:{port}"]
        command += ["--control-plane", cp_url, "--workers", "2", "--poll-interval-s", "0.1"]
        env = {**os.environ, "ROUTER_KEY": "op-key"}
        proc = subprocess.Popen(command, stderr=subprocess.DEVNULL, env=env)
        try:
            deadline = time.monotonic() + 20
            while cp.polls < 6:  # both workers polling: one holds the table, one is refused
                assert time.monotonic() < deadline and proc.poll() is None, "the workers did not poll"
                await asyncio.sleep(0.05)
            assert cp.answered == 1
            assert set(await health(port)) <= {0, 503}  # the worker with the table says so too
            cp.released = True
            while (await health(port)).count(200) < 24:
                assert time.monotonic() < deadline, "the workers did not become ready"
                await asyncio.sleep(0.1)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            server.close()

    asyncio.run(go())
