"""A client that reads slower than the pod writes pauses the pod's socket: bounded buffers."""

import asyncio

from dataplane.router.upstream import UpstreamConnection
from tests.router.conftest import assert_idle, raw_post, running, wait_until, with_config
from tests.router.fakepod import FakePod


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


def test_a_connection_left_paused_by_its_last_client_reads_its_next_answer():
    """A pod connection whose reading the last answer's client left paused (its last read both
    ended the answer and filled that client's buffer) goes back to the pool so; the next
    request on it reads its answer (it would wait for a read timeout that never comes)."""

    class Answer:
        def __init__(self) -> None:
            self.done = asyncio.get_running_loop().create_future()

        def upstream_head(self, status, headers):
            self.status = status

        def upstream_body(self, data):
            pass

        def upstream_flush(self):
            pass

        def upstream_done(self):
            self.done.set_result(self.status)

        def upstream_lost(self, exc):
            self.done.set_exception(exc or ConnectionError())

    async def go():
        pod = await FakePod("pod-0").start()
        _, conn = await asyncio.get_running_loop().create_connection(
            lambda: UpstreamConnection("pod"), "127.0.0.1", pod.port
        )
        request = b'POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 15\r\n\r\n{"model": "m"}\n'
        for _ in range(2):
            answer = Answer()
            conn.send(request, answer)
            assert await asyncio.wait_for(answer.done, 2) == 200
            conn.sink = None
            conn.pause_reading()  # as a slow client leaves it
        conn.close()
        await pod.stop()

    asyncio.run(go())


def test_a_client_that_reads_nothing_for_the_read_timeout_is_cut_and_billed():
    """A paused pod is not silent, so the read timeout does not cut it as lost; a client that
    reads nothing for as long (``upstream_read_timeout_s``) is cut instead: its stall, billed as
    its cut (what it was sent), no error, nothing held past the timeout."""

    async def go():
        cfg = with_config(
            write_high_water_bytes=64 * 1024, write_low_water_bytes=16 * 1024, upstream_read_timeout_s=0.5
        )
        async with running(1, config=cfg) as (router, pods):
            pods[0].mode, pods[0].chunks, pods[0].delay_s, pods[0].pad = "stream", 400, 0, 16_000
            reader, writer = await raw_post(router, b'{"model": "m", "prompt": "hi", "stream": true}')
            await asyncio.wait_for(reader.readuntil(b"data: "), 2)
            writer.transport.pause_reading()  # our client stops reading, for good
            await wait_until(lambda: router.meter.totals[(0, "")].requests == 1, timeout=3)
            await assert_idle(router)
            totals = router.meter.totals[(0, "")]
            assert totals.errors == 0 and totals.tokens_out > 0 and totals.mu > 0
            writer.close()

    asyncio.run(go())
