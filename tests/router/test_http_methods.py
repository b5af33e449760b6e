"""Methods on the router's own paths (RFC 9110 9.3, 15.5.6): 405 names the allowed methods in
``Allow``, HEAD answers as GET without a body (the connection stays usable), OPTIONS says
``Allow``. Checked with httpx (h11, strict framing), curl and raw bytes."""

import asyncio
import shutil

import httpx
import pytest

from tests.router.conftest import TENANT_KEY, cp_table, error_of, running

READ_ONLY = "GET, HEAD, OPTIONS"
PROXIED = "POST, OPTIONS"


@pytest.mark.parametrize(
    "method, path, allow",
    [
        ("GET", "/v1/completions", PROXIED),
        ("PUT", "/v1/chat/completions", PROXIED),
        ("HEAD", "/v1/completions", PROXIED),
        ("POST", "/v1/models", READ_ONLY),
        ("DELETE", "/metrics", READ_ONLY),
        ("POST", "/health", READ_ONLY),
    ],
)
def test_a_method_not_allowed_gets_405_with_allow(method, path, allow):
    async def go():
        async with running(1, table=cp_table()) as (router, pods):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{router.port}", timeout=5) as client:
                response = await client.request(
                    method, path, headers={"authorization": f"Bearer {TENANT_KEY}"}
                )
            assert response.status_code == 405 and response.headers["allow"] == allow
            if method != "HEAD":
                error = error_of(response.content)
                assert error["code"] == "method_not_allowed" and method in error["message"]
            assert pods[0].requests == 0

    asyncio.run(go())


@pytest.mark.parametrize("path", ["/metrics", "/health", "/v1/models"])
def test_head_answers_as_get_without_a_body(path):
    async def go():
        async with running(1, table=cp_table()) as (router, _):
            auth = {"authorization": f"Bearer {TENANT_KEY}"}
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{router.port}", timeout=5) as client:
                got = await client.get(path, headers=auth)
                head = await client.head(path, headers=auth)
                again = await client.get(path, headers=auth)  # same connection: nothing left over
            assert got.status_code == head.status_code == again.status_code == 200
            assert head.content == b""
            for name in ("content-type", "content-length"):
                assert head.headers[name] == got.headers[name], name
            if path != "/metrics":  # the scrape grows with each request; the others do not
                assert again.content == got.content

    asyncio.run(go())


def test_head_sends_no_body_bytes_on_the_wire():
    async def go():
        async with running(1) as (router, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            writer.write(b"HEAD /health HTTP/1.1\r\nhost: x\r\n\r\nGET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            second = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)  # the very next bytes
            writer.close()
            assert first.startswith(b"HTTP/1.1 200") and b"content-length: 16" in first
            assert second.startswith(b"HTTP/1.1 200")

    asyncio.run(go())


@pytest.mark.parametrize(
    "path, allow", [("/v1/completions", PROXIED), ("/v1/models", READ_ONLY), ("/metrics", READ_ONLY)]
)
def test_options_says_allow(path, allow):
    async def go():
        async with running(1) as (router, pods):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{router.port}", timeout=5) as client:
                response = await client.options(path)
            assert response.status_code == 200 and response.headers["allow"] == allow
            assert response.headers["content-length"] == "0" and pods[0].requests == 0

    asyncio.run(go())


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_head_of_metrics():
    async def go():
        async with running(1) as (router, _):
            proc = await asyncio.create_subprocess_exec(
                "curl", "-sfI", "--max-time", "5", f"http://127.0.0.1:{router.port}/metrics",
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await proc.communicate()
            assert proc.returncode == 0 and out.startswith(b"HTTP/1.1 200")
            assert b"content-type: text/plain; version=0.0.4" in out

    asyncio.run(go())
