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


def test_a_client_that_leaves_after_the_whole_answer_does_not_cancel_its_request():
    """The client reads the whole answer and closes before the handler's bookkeeping after it
    ran (on a loaded machine, often): the request was served and is finished, not cancelled (a
    cancel counted it as an error); a client that leaves before the answer cancels it."""
    from dataplane.router.config import RouterConfig
    from dataplane.router.http import ClientConnection, ServerState

    async def go():
        gate, outcome = asyncio.Event(), []

        async def handler(conn, req):
            try:
                if req.path == b"/answered":
                    conn.send_response(200, b"", b"ok")
                await gate.wait()  # the bookkeeping after the answer, or a pod that is slow
                outcome.append((req.path, "finished"))
            except asyncio.CancelledError:
                outcome.append((req.path, "cancelled"))
                raise

        state = ServerState(RouterConfig(), handler)
        connections = []

        def connection():
            connections.append(ClientConnection(state))
            return connections[-1]

        server = await asyncio.get_running_loop().create_server(connection, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            for path in (b"/answered", b"/unanswered"):
                gate.clear()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path)
                if path == b"/answered":
                    assert (await asyncio.wait_for(reader.read(100), 2)).endswith(b"\r\n\r\nok")
                writer.close()
                while not connections[-1].closed:  # the router saw the client go
                    await asyncio.sleep(0.01)
                gate.set()
                while len(outcome) < (1 if path == b"/answered" else 2):
                    await asyncio.sleep(0.01)
            assert outcome == [(b"/answered", "finished"), (b"/unanswered", "cancelled")]
        finally:
            server.close()

    asyncio.run(go())
