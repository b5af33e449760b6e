"""``python -m dataplane.router`` end to end: static mode with the bench's exact command line,
two SO_REUSEPORT workers, SIGTERM drains and exits 0."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.router.conftest import free_port
from tests.router.fakepod import FakePod

pytestmark = pytest.mark.stack  # routers as subprocesses


def test_static_mode_command_line_serves_and_drains_on_sigterm():
    async def go():
        pod = await FakePod("p").start()
        port = free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dataplane.router",
                "--listen",
                f"127.0.0.1:{port}",
                "--backends",
                f"{pod.url},{pod.url}",
                "--policy",
                "p2c-mu",
                "--workers",
                "2",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONWARNINGS": "error"},
        )
        try:
            from dataplane.router.upstream import fetch

            deadline = time.monotonic() + 10
            status = 0
            while time.monotonic() < deadline:
                try:
                    status, _, body = await fetch(
                        f"http://127.0.0.1:{port}/v1/completions",
                        "POST",
                        {},
                        b'{"model": "anything", "prompt": "hi"}',
                        2,
                    )
                    break
                except OSError:
                    await asyncio.sleep(0.1)
            assert status == 200 and b'"pod": "p"' in body
            # Each worker counts its own requests; any worker's /metrics shows the sum.
            for _ in range(9):
                await fetch(
                    f"http://127.0.0.1:{port}/v1/completions",
                    "POST",
                    {},
                    b'{"model": "m", "prompt": "hi"}',
                    2,
                )
            line = b'router_requests_total{endpoint="*",endpoint_id="0",tenant=""} 10'
            for _ in range(60):  # the other worker's snapshot is at most a second old
                _, _, metrics = await fetch(f"http://127.0.0.1:{port}/metrics", "GET", {}, b"", 2)
                if line in metrics:
                    break
                await asyncio.sleep(0.1)
            assert line in metrics, metrics.decode()[:2000]
            proc.send_signal(signal.SIGTERM)
            for _ in range(100):
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            assert proc.returncode == 0, proc.stdout.read().decode() if proc.stdout else ""
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(5)
            if proc.stdout:
                proc.stdout.close()
            await pod.stop()

    asyncio.run(go())


def test_workers_that_cannot_listen_make_the_router_fail():
    """--workers 2 on a port another socket holds: each worker's bind fails, and the router
    exits non-zero saying why (it exited 0 with nothing on stderr)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "dataplane.router", "--listen", f"127.0.0.1:{port}"]
        command += ["--backends", "http://127.0.0.1:9", "--workers", "2"]
        done = subprocess.run(command, capture_output=True, timeout=60, check=False)
    assert done.returncode != 0 and b"address already in use" in done.stderr.lower()


def test_a_worker_killed_stops_the_others_and_the_router_fails():
    """One of two workers killed: the other is stopped and the router exits non-zero, so its
    supervisor restarts it whole (it ran on short of a worker, or never ready)."""
    port = free_port()
    command = [sys.executable, "-m", "dataplane.router", "--listen", f"127.0.0.1:{port}"]
    command += ["--backends", "http://127.0.0.1:9", "--workers", "2"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")  # this router's own workers
    try:
        deadline = time.monotonic() + 20
        while len(children.read_text().split()) < 2:
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.05)
        os.kill(int(children.read_text().split()[0]), signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode != 0 and b"exited with -9: stopping the others" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
