"""HTTP/1.1 details: pipelined requests answered in order, Expect: 100-continue, HTTP/1.0 clients,
query strings, the tenant's key never forwarded to the pod."""

import asyncio

from tests.router.conftest import TENANT_KEY, assert_idle, call, cp_table, running


def test_pipelined_requests_are_answered_in_order():
    async def go():
        async with running(1) as (router, pods):
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            reqs = b"".join(
                b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(b), b)
                for b in (
                    b'{"model": "m", "prompt": "a"}',
                    b'{"model": "m", "prompt": "bb"}',
                    b'{"model": "m", "prompt": "ccc"}',
                )
            )
            writer.write(reqs)  # all three in one segment
            for _ in range(3):
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
            writer.close()
            assert [b["prompt"] for b in pods[0].bodies] == ["a", "bb", "ccc"]
            await assert_idle(router)

    asyncio.run(go())


def test_expect_100_continue_gets_an_interim_response():
    async def go():
        async with running(1) as (router, _):
            body = b'{"model": "m", "prompt": "hi"}'
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            writer.write(
                b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
                b"content-length: %d\r\n\r\n" % len(body)
            )
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(body)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            assert head.startswith(b"HTTP/1.1 200")
            writer.close()

    asyncio.run(go())


def test_http10_stream_is_close_delimited():
    async def go():
        async with running(1) as (router, pods):
            pods[0].mode = "stream"
            body = b'{"model": "m", "prompt": "hi", "stream": true}'
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            writer.write(b"POST /v1/completions HTTP/1.0\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            data = await asyncio.wait_for(reader.read(), 2)  # ends when the router closes
            writer.close()
            assert b"transfer-encoding" not in data.lower() and data.endswith(b"data: [DONE]\n\n")
            await assert_idle(router)

    asyncio.run(go())


def test_query_string_and_headers_forwarded_but_not_the_tenant_key():
    async def go():
        async with running(1, table=cp_table()) as (router, pods):
            status, _, _ = await call(
                router,
                path="/v1/chat/completions?trace=1",
                body={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
                key=TENANT_KEY,
                headers={"x-request-id": "abc"},
            )
            assert status == 200
            sent = pods[0].headers[0]
            assert sent["x-request-id"] == "abc" and "authorization" not in sent
            assert sent["host"] == pods[0].url.removeprefix("http://")

    asyncio.run(go())
