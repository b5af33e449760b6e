"""Retry on another pod when the connection fails before any byte; never after the stream began."""

import asyncio

from dataplane.router.discovery import static_table
from tests.router.conftest import assert_idle, call, free_port, raw_post, running
from tests.router.fakepod import FakePod


def test_connection_refused_is_retried_on_another_pod():
    async def go():
        good = await FakePod("good").start()
        dead = f"http://127.0.0.1:{free_port()}"
        table = static_table([dead, good.url], "round-robin", 0)
        async with running([good], table=table) as (router, _):
            for _ in range(4):
                status, _, body = await call(router, body={"model": "m", "prompt": "hi"})
                assert status == 200, body
            assert good.requests == 4
            dead_pod = router.endpoints[0].pods[0]
            assert dead_pod.consecutive_failures >= 2
            await assert_idle(router)

    asyncio.run(go())


def test_connection_closed_before_answer_is_retried():
    async def go():
        async with running(2) as (router, pods):
            pods[0].mode = "close"
            pods[1].mode = "close"
            status, _, _ = await call(router, body={"model": "m", "prompt": "hi"})
            # every pod closed before answering: each tried once (never the same pod twice), then 502
            assert status == 502
            assert (pods[0].requests, pods[1].requests) == (1, 1)
            pods[1].mode = "ok"
            for _ in range(5):
                status, headers, _ = await call(router, body={"model": "m", "prompt": "hi"})
                assert status == 200 and headers["x-pod"] == pods[1].url
            await assert_idle(router)

    asyncio.run(go())


def test_no_retry_after_the_stream_started():
    async def go():
        async with running(2) as (router, pods):
            for p in pods:
                p.mode = "break"  # one event, then the pod dies
            reader, writer = await raw_post(router, b'{"model": "m", "prompt": "hi", "stream": true}')
            data = b""
            for _ in range(100):
                chunk = await asyncio.wait_for(reader.read(65536), 2)
                if not chunk:
                    break
                data += chunk
            writer.close()
            assert b"200 OK" in data and data.count(b"data: ") == 1
            assert not data.endswith(b"0\r\n\r\n")  # cut, not a clean end: the client can tell
            assert pods[0].requests + pods[1].requests == 1  # never retried
            await assert_idle(router)

    asyncio.run(go())
