"""``python -m dataplane.router`` end to end: static mode with the bench's exact command line,
two SO_REUSEPORT workers, SIGTERM drains and exits 0."""

import asyncio
import os
import signal
import subprocess
import sys
import time

from tests.router.conftest import free_port
from tests.router.fakepod import FakePod


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
