"""The runtime's HTTP client reads every body framing RFC 9112 allows (Content-Length, chunked,
close-delimited), keeps a connection only when it may, and fails loudly on an answer cut short
or one that is not HTTP; the servers here answer with canned bytes, as an odd server would."""

from __future__ import annotations

import asyncio

import pytest

from dataplane.runtime.http_client import ClientResponse, Connection, request


async def answering(*answers: bytes, close: bool) -> tuple[asyncio.Server, int]:
    """A server that reads one request head per answer and writes the answer's bytes as they are."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for answer in answers:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(answer)
                await writer.drain()
            if not close:
                await reader.read()  # stays open until the client goes
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


def exchange_twice(*answers: bytes, close: bool = False) -> tuple[list[ClientResponse], bool]:
    """The answers to one GET per answer on one connection, and whether it stayed reusable."""

    async def go() -> tuple[list[ClientResponse], bool]:
        server, port = await answering(*answers, close=close)
        async with server:
            connection = await Connection.open("127.0.0.1", port)
            try:
                responses = [await connection.exchange("GET", "/") for _ in answers]
                return responses, connection.reusable
            finally:
                connection.close()

    return asyncio.run(go())


def test_chunked_answers_are_read_whole_and_the_connection_kept() -> None:
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    responses, reusable = exchange_twice(chunked, chunked)
    assert [r.body for r in responses] == [b"hello world", b"hello world"]
    assert reusable


def test_content_length_answers_are_read_exactly() -> None:
    sized = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    responses, reusable = exchange_twice(sized, sized)
    assert [(r.status, r.body, r.headers["content-length"]) for r in responses] == [(200, b"ok", "2")] * 2
    assert reusable


def test_a_close_delimited_answer_ends_at_the_close_and_the_connection_is_done() -> None:
    responses, reusable = exchange_twice(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it", close=True
    )
    assert responses[0].body == b"all of it"
    assert not reusable


def test_connection_close_from_the_server_makes_the_connection_not_reusable() -> None:
    _, reusable = exchange_twice(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
    assert not reusable


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", "closed the connection before"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel", "closed the connection before"),
        (b"HTTP/1.1 200 OK\r\ncontent-le", "closed the connection before"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not valid HTTP"),
    ],
)
def test_an_answer_cut_short_or_not_http_is_a_connection_error(answer: bytes, message: str) -> None:
    async def go() -> None:
        server, port = await answering(answer, close=True)
        async with server:
            with pytest.raises(ConnectionError, match=message):
                await request("GET", "127.0.0.1", port, "/", timeout_s=5)

    asyncio.run(go())
