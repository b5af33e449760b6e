"""Bad input gets a clear OpenAI-style error and leaks nothing: counters back to zero."""

import asyncio

import pytest

from tests.router.conftest import (
    OTHER_KEY,
    TENANT_KEY,
    assert_idle,
    call,
    cp_table,
    error_of,
    raw_post,
    running,
    wait_until,
    with_config,
)


@pytest.mark.parametrize(
    "body, key, status, code",
    [
        (b'{"model": "chat", "prompt": ', TENANT_KEY, 400, "invalid_json"),
        (b'["not", "an", "object"]', TENANT_KEY, 400, "invalid_json"),
        (b"\xff\xfe", TENANT_KEY, 400, "invalid_json"),
        (b'{"prompt": "hi"}', TENANT_KEY, 400, "missing_model"),
        (b'{"model": "nope", "prompt": "hi"}', TENANT_KEY, 404, "model_not_found"),
        (b'{"model": "chat", "prompt": "hi"}', None, 401, "missing_api_key"),
        (b'{"model": "chat", "prompt": "hi"}', "sk-revoked", 401, "invalid_api_key"),
        (
            b'{"model": "chat", "prompt": "hi"}',
            OTHER_KEY,
            404,
            "model_not_found",
        ),  # another tenant's endpoint
    ],
)
def test_bad_request_answers(body, key, status, code):
    async def go():
        async with running(1, table=cp_table()) as (router, pods):
            got, headers, payload = await call(router, body=body, key=key)
            assert got == status and headers["content-type"] == "application/json"
            assert error_of(payload)["code"] == code
            assert pods[0].requests == 0
            await assert_idle(router)

    asyncio.run(go())


def test_unknown_path_and_wrong_method():
    async def go():
        async with running(1) as (router, _):
            assert (await call(router, path="/v2/anything", method="GET"))[0] == 404
            assert (await call(router, path="/v1/completions", method="GET"))[0] == 405

    asyncio.run(go())


def test_oversized_body_is_413_before_reading_it():
    async def go():
        async with running(1, config=with_config(max_body_bytes=1000)) as (router, pods):
            status, _, payload = await call(router, body=b'{"model": "m", "prompt": "' + b"x" * 2000 + b'"}')
            assert status == 413 and error_of(payload)["code"] == "body_too_large"
            # chunked upload without a length: caught while reading
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
            for _ in range(3):
                writer.write(b"200\r\n" + b"x" * 512 + b"\r\n")
            resp = await asyncio.wait_for(reader.read(), 2)
            assert resp.startswith(b"HTTP/1.1 413")
            writer.close()
            assert pods[0].requests == 0
            await assert_idle(router)

    asyncio.run(go())


def test_oversized_headers_are_431():
    async def go():
        async with running(1, config=with_config(max_header_bytes=1024)) as (router, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            writer.write(b"GET /health HTTP/1.1\r\nx-big: " + b"a" * 2000 + b"\r\n\r\n")
            resp = await asyncio.wait_for(reader.read(), 2)
            assert resp.startswith(b"HTTP/1.1 431")
            writer.close()

    asyncio.run(go())


def test_malformed_http_is_400():
    async def go():
        async with running(1) as (router, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            writer.write(b"THIS IS NOT HTTP\r\n\r\n")
            resp = await asyncio.wait_for(reader.read(), 2)
            assert resp.startswith(b"HTTP/1.1 400")
            writer.close()
            await assert_idle(router)

    asyncio.run(go())


def test_slowloris_headers_and_body_get_408():
    async def go():
        cfg = with_config(header_read_timeout_s=0.2, body_read_timeout_s=0.2)
        async with running(1, config=cfg) as (router, pods):
            loop = asyncio.get_running_loop()
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            t0 = loop.time()
            writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")  # headers never finish
            resp = await asyncio.wait_for(reader.read(), 2)
            assert resp.startswith(b"HTTP/1.1 408") and b"headers" in resp and loop.time() - t0 < 1
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            writer.write(b'POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{"mo')
            resp = await asyncio.wait_for(reader.read(), 2)
            assert resp.startswith(b"HTTP/1.1 408") and b"body" in resp
            writer.close()
            # a silent connection is closed without a word
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            assert await asyncio.wait_for(reader.read(), 2) == b""
            writer.close()
            assert pods[0].requests == 0
            await assert_idle(router)
            assert len(router.state.connections) == 0

    asyncio.run(go())


def test_a_client_that_gives_up_on_a_silent_pod_counts_an_error():
    """The pod sends one chunk and falls silent; the client leaves after the router's
    ``gave_up_after_silence_s``: a stall it gave up on, an error for on-call (a client that
    leaves while tokens flow is none: the test below)."""

    async def go():
        async with running(1, config=with_config(gave_up_after_silence_s=0.2)) as (router, pods):
            pods[0].mode, pods[0].chunks, pods[0].delay_s = "stream", 3, 30  # silent after one chunk
            reader, writer = await raw_post(router, b'{"model": "m", "prompt": "hi", "stream": true}')
            await asyncio.wait_for(reader.readuntil(b"data: "), 2)
            await wait_until(lambda: router.endpoints[0].pods[0].inflight_requests == 1)
            await asyncio.sleep(0.3)  # real silence: the router reads the pod's clock, not ours
            writer.transport.abort()
            await assert_idle(router)
            totals = router.meter.totals[(0, "")]
            assert (totals.requests, totals.errors) == (1, 1)

    asyncio.run(go())


def test_client_disconnect_mid_stream_cancels_upstream_and_releases_counters():
    async def go():
        async with running(1) as (router, pods):
            pods[0].mode, pods[0].chunks, pods[0].delay_s = "stream", 200, 0.02
            reader, writer = await raw_post(router, b'{"model": "m", "prompt": "hi", "stream": true}')
            await asyncio.wait_for(reader.readuntil(b"data: "), 2)
            assert router.endpoints[0].pods[0].inflight_requests == 1
            writer.transport.abort()  # the client goes away mid-stream
            await assert_idle(router)
            await wait_until(lambda: pods[0].cancelled)
            assert pods[0].cancelled == 1 and pods[0].open_connections == 0
            totals = router.meter.totals[(0, "")]
            assert (totals.requests, totals.errors) == (1, 0)  # metered; the client's cut, no error

    asyncio.run(go())


def test_models_lists_only_the_tenants_endpoints():
    async def go():
        async with running(1, table=cp_table()) as (router, _):
            status, _, payload = await call(router, path="/v1/models", method="GET", key=TENANT_KEY)
            assert status == 200 and b'"id": "chat"' in payload
            status, _, payload = await call(router, path="/v1/models", method="GET", key=OTHER_KEY)
            assert status == 200 and b'"data": []' in payload
            assert (await call(router, path="/v1/models", method="GET"))[0] == 401

    asyncio.run(go())


def nested(levels: int) -> bytes:
    """A chat request whose tool's JSON schema makes the body `levels` deep (5 of them the
    request's own: body -> tools -> [0] -> function -> parameters)."""
    schema = '{"type": "string"}'
    for _ in range((levels - 5) // 2):
        schema = f'{{"type": "object", "properties": {{"p": {schema}}}}}'
    return (
        b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": '
        b'"function", "function": {"name": "f", "parameters": %s}}]}' % schema.encode()
    )


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b'{"model": "chat", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"model": "chat", "prompt": "hi", "x": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b"}",
        nested(200),
    ],
    ids=["100k-open", "100k-prompt", "100k-objects", "schema-200-deep"],
)
def test_any_nesting_depth_is_a_400_and_the_router_serves_on(body, caplog):
    async def go():
        async with running(1, table=cp_table()) as (router, pods):
            got, headers, payload = await call(router, body=body, key=TENANT_KEY, path="/v1/chat/completions")
            assert got == 400 and headers["content-type"] == "application/json", payload[:300]
            error = error_of(payload)
            assert error["code"] == "invalid_json" and "nested deeper than 128 levels" in error["message"]
            assert pods[0].requests == 0
            # The next request, and one whose tool schema nests as deep as real ones ever do, are served.
            for ok in (b'{"model": "chat", "prompt": "hi"}', nested(60)):
                path = "/v1/chat/completions" if b"messages" in ok else "/v1/completions"
                assert (await call(router, body=ok, key=TENANT_KEY, path=path))[0] == 200
            await assert_idle(router)

    asyncio.run(go())
    assert not [r for r in caplog.records if r.exc_info or r.levelname in ("ERROR", "CRITICAL")]
