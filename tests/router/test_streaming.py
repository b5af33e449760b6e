"""SSE streaming passes through chunk by chunk, not buffered until the end."""

import asyncio
import time

from tests.router.conftest import assert_idle, raw_post, running


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
