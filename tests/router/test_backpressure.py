"""A client that reads slower than the pod writes pauses the pod's socket: bounded buffers."""

import asyncio

from tests.router.conftest import assert_idle, raw_post, running, wait_until, with_config


def test_slow_reader_pauses_upstream_and_buffers_stay_bounded():
    async def go():
        cfg = with_config(write_high_water_bytes=64 * 1024, write_low_water_bytes=16 * 1024)
        async with running(1, config=cfg) as (router, pods):
            # the pod streams 400 events of ~16 KiB (6.4 MB) as fast as it can
            pods[0].mode, pods[0].chunks, pods[0].delay_s, pods[0].pad = "stream", 400, 0, 16_000

            body = b'{"model": "m", "prompt": "hi", "stream": true}'
            reader, writer = await raw_post(router, body, limit=2**20)
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            writer.transport.pause_reading()  # our client stops reading
            await asyncio.sleep(0.5)
            client_conn = next(iter(router.state.connections))
            buffered = client_conn.transport.get_write_buffer_size()
            assert client_conn.write_paused
            assert not client_conn.flow_peer.transport.is_reading()  # the pod's socket is paused
            # bounded: about high water + one socket read, not the whole stream
            assert buffered < 64 * 1024 + 300 * 1024
            writer.transport.resume_reading()
            data = b""
            for _ in range(100_000):
                chunk = await asyncio.wait_for(reader.read(2**20), 5)
                if not chunk:
                    break
                data += chunk
                if b"[DONE]" in data:
                    break
            assert b"[DONE]" in data
            writer.close()
            await assert_idle(router)

    asyncio.run(go())


def test_a_client_that_stops_reading_and_leaves_pays_for_what_it_was_sent():
    """The router stops reading a pod whose client does not read (backpressure): the pod is not
    silent then, the router is not listening. A client that stalls past
    ``gave_up_after_silence_s`` and leaves cut its own stream: the tokens passed on to it are
    billed, and it is no error (it was free, and on-call's, when the pause counted as the pod's
    silence)."""

    async def go():
        cfg = with_config(
            write_high_water_bytes=64 * 1024, write_low_water_bytes=16 * 1024, gave_up_after_silence_s=0.2
        )
        async with running(1, config=cfg) as (router, pods):
            pods[0].mode, pods[0].chunks, pods[0].delay_s, pods[0].pad = "stream", 400, 0, 16_000
            reader, writer = await raw_post(router, b'{"model": "m", "prompt": "hi", "stream": true}')
            await asyncio.wait_for(reader.readuntil(b"data: "), 2)
            writer.transport.pause_reading()  # our client stops reading
            await wait_until(lambda: any(c.write_paused for c in router.state.connections))
            client_conn = next(c for c in router.state.connections if c.write_paused)
            await wait_until(lambda: not client_conn.flow_peer.transport.is_reading())
            await asyncio.sleep(0.4)  # past gave_up_after_silence_s, the pod's socket paused
            writer.transport.abort()
            await assert_idle(router)
            totals = router.meter.totals[(0, "")]
            assert (totals.requests, totals.errors) == (1, 0)
            assert totals.tokens_out > 0 and totals.mu > 0

    asyncio.run(go())

