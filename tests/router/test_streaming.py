"""SSE streaming passes through chunk by chunk, not buffered until the end."""

import asyncio
import json
import time

from tests.router.conftest import assert_idle, call, raw_post, running, wait_until


def test_sse_events_arrive_as_the_pod_sends_them():
    async def go():
        async with running(1) as (router, pods):
            pods[0].mode, pods[0].chunks, pods[0].delay_s = "stream", 5, 0.1
            reader, writer = await raw_post(router, b'{"model": "m", "prompt": "hi", "stream": true}')
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            assert b"200 OK" in head and b"text/event-stream" in head and b"chunked" in head
            arrivals = []
            t0 = time.monotonic()
            data = b""
            while b"[DONE]" not in data:
                chunk = await asyncio.wait_for(reader.read(65536), 2)
                assert chunk
                data += chunk
                arrivals.append(time.monotonic() - t0)
            writer.close()
            # 5 events 100 ms apart: the first arrives long before the last (no buffering)
            assert len(arrivals) >= 4
            assert arrivals[-1] - arrivals[0] > 0.3
            # 5 tokens + [DONE]: the usage event the router asked for is not passed on
            assert data.count(b"data: ") == 6 and b'"usage"' not in data
            await assert_idle(router)
            # exact metering from the usage event: 10 in, 5 out
            totals = router.meter.totals[(0, "")]
            assert (totals.tokens_in, totals.tokens_out) == (10, 5)

    asyncio.run(go())


def test_keep_alive_connection_serves_many_requests_and_pools_upstream():
    async def go():
        async with running(1) as (router, pods):
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            body = b'{"model": "m", "prompt": "hi"}'
            for _ in range(20):
                writer.write(
                    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(body), body)
                )
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
                length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
            writer.close()
            assert pods[0].requests == 20
            assert router.pool.idle_count() == 1  # one pooled upstream connection served them all
            await assert_idle(router)

    asyncio.run(go())


def test_a_new_request_goes_to_the_pod_already_answering_not_the_one_still_prefilling():
    """p2c-mu counts the MU of a request its pod has not begun to answer twice: the engine spends
    its steps on that prompt before a new request's (dataplane.router.balancer). With 2.1 MU held
    unanswered on one pod (100 tokens asked, 0.002 x in + 0.02 x out + 0.1) and 3.1 MU streaming
    on the other (150 tokens), a new request goes to the streaming one: 3.1 < 2 x 2.1, though
    2.1 < 3.1 in flight."""

    def body(max_tokens: int, stream: bool = False) -> bytes:
        return json.dumps({"model": "m", "prompt": "", "max_tokens": max_tokens, "stream": stream}).encode()

    async def go():
        async with running(2) as (router, pods):
            for p in pods:
                p.mode, p.chunks, p.delay_s = "hold", 50, 0.1  # a stream answers for 5 s
            _, held_writer = await raw_post(router, body(100))
            await wait_until(lambda: sum(p.requests for p in pods) == 1, what="the held request")
            held, other = sorted(pods, key=lambda p: -p.requests)
            other.mode = "stream"
            reader, writer = await raw_post(router, body(150, stream=True))
            await asyncio.wait_for(reader.readuntil(b"data: "), 2)  # its first token came back
            assert other.requests == 1
            other.mode = "ok"
            status, _, _ = await call(router, body=json.loads(body(10)))
            assert status == 200
            assert (held.requests, other.requests) == (1, 2)
            held.release.set()
            writer.close()
            held_writer.close()
            await assert_idle(router)

    asyncio.run(go())
