"""The runtime pods' HTTP server (uvicorn underneath) as a hostile or careless client finds it:
oversized heads and bodies get a clear 4xx, a handler's bug is a 500 on a connection that goes
on serving, HEAD answers without a body, and closing cancels what outlives the drain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager

import httpx

from dataplane.runtime.http_server import (
    Handler,
    HttpLimits,
    HttpServer,
    Request,
    Response,
    StreamingResponse,
    json_response,
)

LIMITS = HttpLimits(max_header_bytes=1024, max_body_bytes=1000, drain_s=0.2)


async def echo(request: Request) -> Response:
    if request.path == "/boom":
        raise RuntimeError("a handler bug")
    return json_response(200, {"method": request.method, "body": len(request.body)})


@asynccontextmanager
async def serving(handler: Handler = echo) -> AsyncIterator[tuple[HttpServer, str]]:
    server = HttpServer(handler, LIMITS, extra_headers={"x-engine": "simulated"})
    port = await server.start("127.0.0.1", 0)
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        await server.close()


async def raw_exchange(url: str, pieces: list[bytes]) -> bytes:
    """Sends ``pieces`` one write at a time, 10 ms apart, until the server answers; its answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            try:
                first = await asyncio.wait_for(reader.read(65536), 0.01)
            except TimeoutError:
                continue
            return first + await asyncio.wait_for(reader.read(), 5)
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


def test_a_head_over_the_limit_gets_431_naming_the_limit() -> None:
    async def go() -> None:
        async with serving() as (_, url), httpx.AsyncClient() as client:
            answer = await client.get(url + "/", headers={"x-big": "a" * 2000})
            assert answer.status_code == 431
            assert answer.json() == {"error": "request line and headers exceed 1024 bytes"}
            assert answer.headers["x-engine"] == "simulated" and answer.headers["connection"] == "close"

    asyncio.run(go())


def test_a_head_that_never_ends_gets_431_before_it_is_complete() -> None:
    async def go() -> None:
        async with serving() as (_, url):
            # One header line that goes on and on, in 100-byte writes: never a complete header.
            answer = await raw_exchange(
                url, [b"GET / HTTP/1.1\r\nhost: x\r\nx-endless: "] + [b"a" * 100] * 30
            )
            assert answer.startswith(b"HTTP/1.1 431 ")
            assert b"exceed 1024 bytes" in answer

    asyncio.run(go())


def test_a_small_head_with_its_body_in_one_write_is_not_refused() -> None:
    async def go() -> None:
        async with serving() as (_, url):
            body = b"x" * 1000  # head + body > the head's limit, all in one segment
            head = b"POST / HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 1000\r\n\r\n"
            answer = await raw_exchange(url, [head + body])
            assert answer.startswith(b"HTTP/1.1 200 ")
            assert answer.endswith(b'{"method": "POST", "body": 1000}')

    asyncio.run(go())


def test_a_body_over_the_limit_gets_413_whether_announced_or_chunked() -> None:
    async def chunks(count: int) -> AsyncIterator[bytes]:  # sent chunked: no Content-Length
        for _ in range(count):
            yield b"x" * 100

    async def go() -> None:
        async with serving() as (_, url), httpx.AsyncClient() as client:
            announced = await client.post(url + "/", content=b"x" * 1001)
            assert announced.status_code == 413
            assert announced.json() == {"error": "request body exceeds 1000 bytes"}
            chunked = await client.post(url + "/", content=chunks(11))
            assert chunked.status_code == 413
            within = await client.post(url + "/", content=chunks(10))
            assert within.json() == {"method": "POST", "body": 1000}

    asyncio.run(go())


def test_a_handler_bug_is_a_500_and_the_connection_serves_on() -> None:
    async def go() -> None:
        async with serving() as (_, url), httpx.AsyncClient() as client:
            failed = await client.get(url + "/boom")
            assert failed.status_code == 500
            assert failed.json() == {"error": "internal error: RuntimeError('a handler bug')"}
            after = await client.get(url + "/")
            assert after.status_code == 200
            assert failed.extensions["network_stream"].get_extra_info("client_addr") == after.extensions[
                "network_stream"
            ].get_extra_info("client_addr")

    asyncio.run(go())


def test_head_answers_as_get_without_the_body() -> None:
    async def go() -> None:
        async with serving() as (_, url), httpx.AsyncClient() as client:
            answer = await client.head(url + "/")
            get = await client.get(url + "/")
            assert answer.status_code == 200 and answer.content == b""
            assert answer.headers["content-length"] == get.headers["content-length"]
            assert get.json()["method"] == "GET"

    asyncio.run(go())


def test_close_lets_a_short_request_finish_and_cancels_one_past_the_drain() -> None:
    outcomes: list[str] = []

    async def slow(request: Request) -> Response:
        try:
            await asyncio.sleep(float(request.query.removeprefix("s=")))
        except asyncio.CancelledError:
            outcomes.append(f"cancelled {request.query}")
            raise
        outcomes.append(f"finished {request.query}")
        return Response(200, b"done", "text/plain")

    async def go() -> None:
        async with serving(slow) as (server, url), httpx.AsyncClient() as client:
            short = asyncio.create_task(client.get(url + "/?s=0.05"))
            long = asyncio.create_task(client.get(url + "/?s=10"))
            while len(server.state.tasks) < 2:
                await asyncio.sleep(0.01)
            await server.close()  # drain_s 0.2: the first finishes, the second is cancelled
            assert (await short).text == "done"
            assert (await long).status_code == 500  # as uvicorn answers a request cut by shutdown
        assert outcomes == ["finished s=0.05", "cancelled s=10"]

    asyncio.run(go())


def test_a_stream_the_client_leaves_is_closed_on_the_server() -> None:
    async def go() -> None:
        closed = asyncio.Event()

        async def tokens() -> AsyncGenerator[bytes, None]:
            try:
                yield b"data: token\n\n"
                await asyncio.sleep(3600)  # nothing more is written: only the disconnect ends it
            finally:
                closed.set()

        async def stream(request: Request) -> StreamingResponse:
            return StreamingResponse(200, "text/event-stream", tokens())

        async with serving(stream) as (_, url), httpx.AsyncClient() as client:
            async with client.stream("GET", url + "/") as answer:
                assert await answer.aiter_lines().__anext__() == "data: token"
            await asyncio.wait_for(closed.wait(), 2)

    asyncio.run(go())
