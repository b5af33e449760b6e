"""Operator endpoints (/metrics) are off the tenants' port: on the ``--admin-listen`` listener
when there is one, else on the main listener to loopback clients only; anyone else gets the 404
of an unknown path, whatever the method.

Tests bind 127.0.0.1 only, so a client from elsewhere is a connection whose peer address is
classified as remote (``loopback_peer`` is tested on its own, address by address)."""

import asyncio
import os
import signal
import subprocess
import sys

import httpx
import pytest

from dataplane.router import http
from dataplane.router.__main__ import parse_args
from tests.router.conftest import call, error_of, free_ports, running
from tests.router.fakepod import FakePod


@pytest.mark.parametrize(
    "peer, loopback",
    [
        (("127.0.0.1", 5000), True),
        (("127.8.9.10", 5000), True),
        (("::1", 5000, 0, 0), True),
        (("::ffff:127.0.0.1", 5000, 0, 0), True),
        (("10.0.0.5", 5000), False),
        (("::ffff:10.0.0.5", 5000, 0, 0), False),
        (("2001:db8::1", 5000, 0, 0), False),
        (("fe80::1%eth0", 5000, 0, 2), False),
        ("", False),  # a Unix socket
        (None, False),
    ],
)
def test_loopback_peer(peer, loopback):
    assert http.loopback_peer(peer) is loopback


def test_metrics_answer_loopback_clients_on_the_main_listener():
    async def go():
        async with running(1) as (router, _):
            status, _, body = await call(router, path="/metrics", method="GET")
            assert status == 200 and b"router_errors_total" in body

    asyncio.run(go())


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "POST"])
def test_metrics_are_a_404_to_remote_clients_without_an_admin_listener(monkeypatch, method):
    monkeypatch.setattr(http, "loopback_peer", lambda peer: False)

    async def go():
        async with running(1) as (router, _):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{router.port}", timeout=5) as client:
                response = await client.request(method, "/metrics")
                health = await client.get("/health")  # the tenants' paths stay
            assert response.status_code == 404 and "allow" not in response.headers
            if method != "HEAD":
                assert error_of(response.content)["code"] == "not_found"
            assert health.status_code == 200

    asyncio.run(go())


def test_with_an_admin_listener_metrics_are_there_and_not_on_the_main_one():
    async def go():
        async with running(1, admin_listen=("127.0.0.1", 0)) as (router, _):
            await call(router, body={"model": "m", "prompt": "hi"})
            status, _, _ = await call(router, path="/metrics", method="GET")
            assert status == 404  # loopback or not: the admin listener is the operators' door
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{router.admin_port}", timeout=5
            ) as client:
                scrape = await client.get("/metrics")
                health = await client.head("/health")
                completion = await client.post("/v1/completions", content=b'{"model": "m", "prompt": "hi"}')
            assert scrape.status_code == 200
            assert 'router_requests_total{endpoint="*",endpoint_id="0",tenant=""} 1' in scrape.text
            assert health.status_code == 200
            assert completion.status_code == 404  # no tenant traffic on the admin listener

    asyncio.run(go())


def test_admin_listen_must_be_host_and_port(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--backends", "http://127.0.0.1:1", "--admin-listen", "9090"])
    assert exit_.value.code == 2
    assert "--admin-listen: expected host:port (port 0-65535), got '9090'" in capsys.readouterr().err
    args = parse_args(["--backends", "http://127.0.0.1:1", "--admin-listen", "[::1]:9090"])
    assert args.admin_listen == ("::1", 9090)


def test_admin_listen_on_the_listen_port_is_refused(capsys):
    """SO_REUSEPORT would let both bind, and clients would reach the operator endpoints."""
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--backends", "http://127.0.0.1:1", "--listen", "127.0.0.1:8080",
                    "--admin-listen", "0.0.0.0:8080"])  # fmt: skip
    assert exit_.value.code == 2
    assert "--admin-listen must use another port than --listen (8080)" in capsys.readouterr().err
    any_ports = ["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]  # each bound to its own
    assert parse_args(["--backends", "http://x:1", *any_ports]).admin_listen == ("127.0.0.1", 0)


@pytest.mark.stack
def test_two_workers_share_the_admin_port_and_any_scrape_shows_both():
    async def go():
        pod = await FakePod("p").start()
        port, admin = free_ports(2)
        proc = subprocess.Popen(
            [sys.executable, "-m", "dataplane.router", "--listen", f"127.0.0.1:{port}",
             "--admin-listen", f"127.0.0.1:{admin}", "--backends", pod.url, "--workers", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONWARNINGS": "error"},
        )  # fmt: skip
        try:
            async with httpx.AsyncClient(timeout=2) as client:
                for _ in range(100):
                    try:
                        await client.get(f"http://127.0.0.1:{admin}/health")
                        break
                    except httpx.TransportError:
                        await asyncio.sleep(0.1)
                for _ in range(6):  # fresh connections: the kernel spreads them over the workers
                    r = await client.post(
                        f"http://127.0.0.1:{port}/v1/completions",
                        content=b'{"model": "m", "prompt": "hi"}',
                        headers={"connection": "close"},
                    )
                    assert r.status_code == 200
                assert (await client.get(f"http://127.0.0.1:{port}/metrics")).status_code == 404
                line = 'router_requests_total{endpoint="*",endpoint_id="0",tenant=""} 6'
                for _ in range(60):  # the other worker's snapshot is at most a second old
                    text = (await client.get(f"http://127.0.0.1:{admin}/metrics")).text
                    if line in text:
                        break
                    await asyncio.sleep(0.1)
                assert line in text
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(proc.wait, 10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(5)
            if proc.stdout:
                proc.stdout.close()
            await pod.stop()

    asyncio.run(go())
