"""Bodies a pod delimits by closing the connection (RFC 9112 section 6.3), as the simulated engine
sends its streams: the clean close ends the body, the client gets it whole and well framed, no
error is counted and the stream's usage is read. A pod that dies mid-stream is still an error.

The pods here are raw asyncio servers that write exactly the bytes a test gives them, so no
framing is fixed up on the way; the clients are httpx (h11, strict about framing) and curl."""

import asyncio
import shutil

import httpx
import pytest

from dataplane.router.discovery import static_table
from dataplane.router.upstream import ends_at_close
from tests.router.conftest import assert_idle, running, scrape, wait_until
from tests.router.fakepod import FakePod, reset

STREAM = b'{"model": "m", "prompt": "hi", "stream": true, "stream_options": {"include_usage": true}}'
EVENTS = [b'data: {"choices": [{"index": 0, "text": "t%d"}]}\n\n' % i for i in range(3)]
USAGE = (
    b'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}\n\n'
)
DONE = b"data: [DONE]\n\n"
PLAIN = b'{"model": "m", "prompt": "hi", "stream": true}'  # no usage asked: the router asks for it
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
CLOSE_DELIMITED = SSE_HEAD + b"connection: close\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class RawPod:
    """Answers every request with ``parts`` (written 5 ms apart), then ends the connection:
    ``end`` "close" (FIN) or "reset" (RST)."""

    def __init__(self, parts: list[bytes], end: str = "close") -> None:
        self.parts, self.end = parts, end
        self.requests = 0
        self.answered = 0  # requests answered and their connection ended
        self.name = "raw"
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> "RawPod":
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        self.requests += 1
        for part in self.parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.005)
        if self.end == "reset":
            reset(writer)
        else:
            writer.close()
            await writer.wait_closed()
        self.answered += 1


async def errors_total(router) -> float:
    families = await scrape(router)
    return sum(s.value for s in families["router_errors"].samples)


def test_a_close_delimited_stream_reaches_httpx_whole_and_is_no_error():
    async def go():
        pod = await RawPod([CLOSE_DELIMITED, *EVENTS, USAGE, DONE]).start()
        async with running([pod], table=static_table([pod.url], "p2c-mu", 0)) as (router, _):
            url = f"http://127.0.0.1:{router.port}/v1/completions"
            async with httpx.AsyncClient(timeout=5) as client:
                for _ in range(2):  # the client's connection stays usable: chunked, ended by 0\r\n\r\n
                    async with client.stream("POST", url, content=STREAM) as response:
                        assert response.status_code == 200
                        assert response.headers["transfer-encoding"] == "chunked"
                        assert "connection" not in response.headers
                        lines = [line async for line in response.aiter_lines() if line]
                    assert lines[-1] == "data: [DONE]" and len(lines) == 5
            assert pod.requests == 2
            assert await errors_total(router) == 0
            totals = router.meter.totals[(0, "")]
            assert (totals.requests, totals.errors) == (2, 0)
            assert (totals.tokens_in, totals.tokens_out) == (14, 6)  # the usage events, exactly
            await assert_idle(router)
        await pod.stop()

    asyncio.run(go())


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_a_close_delimited_stream_reaches_curl_whole():
    async def go():
        pod = await RawPod([CLOSE_DELIMITED, *EVENTS, USAGE, DONE]).start()
        async with running([pod], table=static_table([pod.url], "p2c-mu", 0)) as (router, _):
            proc = await asyncio.create_subprocess_exec(
                "curl", "-sN", "--max-time", "5", "-d", STREAM, f"http://127.0.0.1:{router.port}/v1/completions",
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await proc.communicate()
            assert proc.returncode == 0
            assert out.endswith(b"data: [DONE]\n\n") and out.count(b"data: ") == 5
            assert await errors_total(router) == 0
        await pod.stop()

    asyncio.run(go())


def test_an_http10_client_gets_a_close_delimited_stream_closed_after_it():
    async def go():
        pod = await RawPod([CLOSE_DELIMITED, *EVENTS, USAGE, DONE]).start()
        async with running([pod], table=static_table([pod.url], "p2c-mu", 0)) as (router, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            writer.write(
                b"POST /v1/completions HTTP/1.0\r\ncontent-length: %d\r\n\r\n%s" % (len(PLAIN), PLAIN)
            )
            data = await asyncio.wait_for(reader.read(), 2)  # to the router's close
            writer.close()
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and b"chunked" not in head.lower()
            assert body == b"".join([*EVENTS, DONE])  # the usage the router asked for is its own
            assert router.meter.totals[(0, "")].errors == 0
        await pod.stop()

    asyncio.run(go())


@pytest.mark.parametrize(
    "parts, end",
    [
        pytest.param([CLOSE_DELIMITED, *EVENTS], "reset", id="close-delimited-reset"),
        pytest.param(
            [SSE_HEAD + b"transfer-encoding: chunked\r\n\r\n", *map(chunk, EVENTS)],
            "close",
            id="chunked-closed-early",
        ),
        pytest.param(
            [SSE_HEAD + b"content-length: 1000\r\n\r\n", *EVENTS], "close", id="content-length-closed-early"
        ),
    ],
)
def test_a_pod_that_dies_mid_stream_is_an_error(parts, end):
    async def go():
        pod = await RawPod(parts, end).start()
        async with running([pod], table=static_table([pod.url], "p2c-mu", 0)) as (router, _):
            url = f"http://127.0.0.1:{router.port}/v1/completions"
            async with httpx.AsyncClient(timeout=5) as client:
                with pytest.raises(httpx.RemoteProtocolError):  # cut, never a clean end
                    async with client.stream("POST", url, content=STREAM) as response:
                        assert response.status_code == 200
                        async for _ in response.aiter_bytes():
                            pass
            assert pod.requests == 1  # never retried after the first byte
            await assert_idle(router)
            assert await errors_total(router) == 1
        await pod.stop()

    asyncio.run(go())


@pytest.mark.parametrize("mode", ["ok", "stream"])
def test_the_fake_pod_answers_close_delimited_when_asked(mode):
    async def go():
        pod = FakePod("p", mode=mode)
        pod.framing = "close"
        await pod.start()
        async with running([pod]) as (router, _):
            url = f"http://127.0.0.1:{router.port}/v1/completions"
            body = STREAM if mode == "stream" else b'{"model": "m", "prompt": "hi"}'
            async with httpx.AsyncClient(timeout=5) as client:
                response = await client.post(url, content=body)
            assert response.status_code == 200
            if mode == "stream":
                assert response.text.endswith("data: [DONE]\n\n")
            else:
                assert response.json()["pod"] == "p"
            totals = router.meter.totals[(0, "")]
            assert totals.errors == 0 and totals.tokens_in == 10  # usage read from the tail
            await assert_idle(router)

    asyncio.run(go())


@pytest.mark.parametrize(
    "status, headers, expected",
    [
        (200, [], True),
        (200, [(b"Content-Length", b"5")], False),
        (200, [(b"Transfer-Encoding", b"chunked")], False),
        (200, [(b"transfer-encoding", b"gzip, chunked")], False),
        (200, [(b"transfer-encoding", b"gzip")], True),  # not chunked last: read to the close
        (200, [(b"transfer-encoding", b"gzip"), (b"transfer-encoding", b"chunked")], False),
        (200, [(b"transfer-encoding", b"chunked"), (b"content-length", b"5")], False),  # TE wins
        (204, [], False),
        (304, [], False),
        (101, [], False),
    ],
)
def test_which_responses_end_at_the_close(status, headers, expected):
    assert ends_at_close(status, headers) is expected


def test_a_stream_the_pod_frames_by_content_length_is_reframed_without_its_usage():
    """The router drops the usage chunk it asked for: the pod's Content-Length no longer holds."""

    async def go():
        body = b"".join([*EVENTS, USAGE, DONE])
        pod = await RawPod(
            [SSE_HEAD + b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body), body]
        ).start()
        async with running([pod], table=static_table([pod.url], "p2c-mu", 0)) as (router, _):
            url = f"http://127.0.0.1:{router.port}/v1/completions"
            async with httpx.AsyncClient(timeout=5) as client:
                response = await client.post(url, content=PLAIN)
            assert response.headers["transfer-encoding"] == "chunked"
            assert response.content == b"".join([*EVENTS, DONE])
            assert router.meter.totals[(0, "")].tokens_out == 3
            await wait_until(lambda: pod.answered == 1, what="the pod's close")
        await pod.stop()

    asyncio.run(go())
