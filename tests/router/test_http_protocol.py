"""HTTP/1.1 details: pipelined requests answered in order, Expect: 100-continue, HTTP/1.0 clients,
query strings, the tenant's key never forwarded to the pod."""

import asyncio
import time

from tests.router.conftest import TENANT_KEY, assert_idle, call, cp_table, running, with_config


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


def test_a_stall_of_the_loop_cuts_no_client():
    """The router's loop stalls 0.6 s between accepting a connection and reading the request
    its client has sent by then: with the tests' shared config the request is answered. Under a
    0.5-s header deadline its timer closed the connection first, with the request unread: a TCP
    reset (the replay of 1,000 requests lost one so, in a full run on a busy machine)."""

    async def ask(config) -> bytes:
        async with running(1, config=config) as (router, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            while not router.state.connections:
                await asyncio.sleep(0)  # the router accepts: its deadline for the head runs
            asyncio.get_running_loop().call_soon(time.sleep, 0.6)  # the stall
            await asyncio.sleep(0)  # the request goes out in the first pass after it, before
            await asyncio.sleep(0)  # the router reads again: its timer fires in that pass
            writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            try:
                return await asyncio.wait_for(reader.read(), 2)
            except ConnectionResetError:
                return b"reset"
            finally:
                writer.close()

    assert asyncio.run(ask(with_config())).startswith(b"HTTP/1.1 200")
    assert asyncio.run(ask(with_config(header_read_timeout_s=0.5))) == b"reset"  # the cause
