"""What a tenant is billed is what its engines did: a mixed set of requests sent over HTTP
through a real router (control-plane mode; publishing to Redis, or posting to the control plane
without it) to simulated engines, the router's published seconds collected into UsageHours by
the autoscaler's pass (as its Celery beat task does), then ``GET /api/v1/usage/`` on the live
control plane. For the endpoint whose requests all run to
their end the usage is exact: the requests answered, the engine's own generation counter, its
prompt counter (which counts a prompt once per choice where the bill, as the engine's usage,
counts it once per request), and alpha x prompt + beta x completion + gamma MU per request to
the millionth (the coefficients are whole millionths, the precision of the router's Redis slots
and of the API); the autoscaler's buckets carry the same requests' MU squared.

Streams the client resets after a few chunks go to a second endpoint on an engine of its own:
an engine keeps generating for a moment after its client left, so their cost is bounded as the
router's metering promises (tests/router/test_metering_replay.py): output tokens at least what
the clients read, at most what their engine generated; input tokens the router's estimate; MU
those tokens priced, to the millionth.

A router stopped while streams are in flight drains them or cuts them at its deadline, and they
are billed too: its last window is published on the way out (it was lost before, with every
router rollout).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from controlplane import scaling
from controlplane.capacity.models import ModelProfile
from controlplane.endpoints import samples
from controlplane.endpoints.models import LoadBucket, Pod, RouterSample
from controlplane.selling import sell
from controlplane.tenants.models import ApiKey
from dataplane.router.pricing import estimate_input_tokens
from dataplane.runtime.metrics import sample_sum
from dataplane.wire.load_samples import routers_key
from tests.conftest import forget_metering
from tests.runtime.support import free_port, sim_engine, wait_until

pytestmark = pytest.mark.stack  # a live_server, engines and routers as subprocesses

# Whole millionths of an MU, so that the bill is exact where the engine's counters are.
ALPHA, BETA, GAMMA = 1300, 21700, 31000  # per prompt token, per generated token, per request
MICRO = 1_000_000
PROMPTS = [
    "Tell me about the weather in the mountains",
    "Write a haiku about routers",
    "List three prime numbers and explain why",
    "hi",
]
RESETS = 8
BROKER = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


def mix(rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """48 requests to "chat", each read to its end: completions and chat, answered whole,
    streamed without usage and streamed with include_usage, n 1 and 2, four of each."""
    out = []
    for path in (COMPLETIONS, CHAT):
        for mode in ("whole", "stream", "stream+usage"):
            for n in (1, 2):
                for _ in range(4):
                    text = rng.choice(PROMPTS)
                    body: dict[str, Any] = {"model": "chat", "max_tokens": rng.randint(1, 12), "n": n}
                    if path == CHAT:
                        body["messages"] = [{"role": "user", "content": text}]
                    else:
                        body["prompt"] = text
                    if mode != "whole":
                        body["stream"] = True
                    if mode == "stream+usage":
                        body["stream_options"] = {"include_usage": True}
                    out.append((path, body))
    rng.shuffle(out)
    return out


def resets(rng: random.Random) -> list[tuple[str, dict[str, Any], int]]:
    """Streams to "cut" that the client resets after reading 1 to 3 token chunks."""
    out = []
    for i in range(RESETS):
        path = CHAT if i % 2 else COMPLETIONS
        text = rng.choice(PROMPTS)
        body: dict[str, Any] = {"model": "cut", "max_tokens": 30, "stream": True}
        body.update({"messages": [{"role": "user", "content": text}]} if path == CHAT else {"prompt": text})
        if i % 4 < 2:
            body["stream_options"] = {"include_usage": True}
        out.append((path, body, rng.randint(1, 3)))
    return out


def call(
    url: str, key: str, body: dict[str, Any] | None = None, method: str | None = None
) -> tuple[int, bytes]:
    """POST ``body`` (GET without one, or `method`) with the key; (status, body read to its end)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url,
        data=data,
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def read_then_reset(port: int, path: str, body: dict[str, Any], key: str, tokens: int) -> int:
    """POST a stream, read ``tokens`` token chunks of it, then reset the connection (RST, not
    FIN): the token chunks read."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            b"POST %s HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (path.encode(), key.encode(), len(data), data)
        )
        got, seen = 0, b""
        while got < tokens and b"[DONE]" not in seen:
            part = s.recv(65536)
            if not part:
                break
            seen += part
            events = [e for e in seen.split(b"\n\n") if b'"choices": [{' in e and b'"role"' not in e]
            got = min(len(events), tokens)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    assert b"[DONE]" not in seen, "a stream to reset ran to its end"
    return got


def engine_counter(url: str, name: str) -> int:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        value = sample_sum(r.read().decode(), name)
    assert value is not None, name
    return round(value)


def prompt_tokens(url: str, path: str, text: str) -> int:
    """The prompt tokens the engine's usage reports for `text` on `path` (asked directly)."""
    asked = {"messages": [{"role": "user", "content": text}]} if path == CHAT else {"prompt": text}
    status, answer = call(url + path, "", {"model": "chat", "max_tokens": 1, **asked})
    assert status == 200, answer
    return int(json.loads(answer)["usage"]["prompt_tokens"])


def text_of(body: dict[str, Any]) -> str:
    return str(body.get("prompt") or body["messages"][0]["content"])


def engine_counts(url: str) -> tuple[int, int]:
    """(prompt tokens, generated tokens) the engine counted."""
    return (
        engine_counter(url, "vllm:prompt_tokens_total"),
        engine_counter(url, "vllm:generation_tokens_total"),
    )


def in_flight(router_url: str) -> float:
    """Requests the router holds in flight, all endpoints (its /metrics, to loopback)."""
    with urllib.request.urlopen(router_url + "/metrics", timeout=5) as r:
        return sample_sum(r.read().decode(), "router_inflight_requests") or 0.0


@contextlib.contextmanager
def router_process(
    control_plane: str, broker: str, operator_key: str, *extra: str
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A router in control-plane mode publishing to Redis at `broker`, or without it (""),
    posting its seconds to the control plane."""
    port = free_port()
    args = ["--listen", f"127.0.0.1:{port}", "--control-plane", control_plane]
    args += ["--redis", broker] if broker else []
    args += extra
    proc = subprocess.Popen(
        [sys.executable, "-m", "dataplane.router", *args, "--poll-interval-s", "0.2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "ROUTER_KEY": operator_key},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url), timeout=30)  # its routing table loaded
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def published_through(sink: str, second: int) -> bool:
    """A router reported `second` or later (its heartbeat)."""
    if not sink:
        return RouterSample.objects.filter(endpoint_id=0, second__gte=second).exists()
    client = redis.Redis.from_url(sink)
    return any(client.exists(routers_key(s)) for s in range(second, second + 5))


def usage_rows(base: str, key: str, **query: Any) -> list[dict[str, Any]]:
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    status, body = call(f"{base}/api/v1/usage/?{qs}", key)
    assert status == 200, body
    answer = json.loads(body)
    assert answer["next"] is None, answer  # one page: a test of the sums, not of paging
    return list(answer["results"])


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows summed over periods (a run across an hour's end has two); MU in millionths."""
    out = {f: sum(r[f] for r in rows) for f in ("requests", "tokens_in", "tokens_out", "errors", "throttled")}
    out["mu"] = round(sum(r["mu"] for r in rows) * MICRO)
    return out


def collect_after(second: int) -> None:
    """The autoscaler's pass as its beat task runs it every 5 s: the first one after the slot
    holding `second` ended and was published (samples.LAG_S)."""
    slot_end = second // samples.BUCKET_S * samples.BUCKET_S + samples.BUCKET_S
    assert scaling.horizontal_pass(None, datetime.fromtimestamp(slot_end + samples.LAG_S, UTC)) is not None


@pytest.fixture
def profile(h100):
    return ModelProfile.objects.create(
        model="sim-tiny",
        gpu_type=h100,
        alpha=ALPHA / MICRO,
        beta=BETA / MICRO,
        gamma=GAMMA / MICRO,
        gpus_per_replica=1,
    )


@pytest.fixture(params=["redis", "posted"])
def sink(request, settings):
    """Where routers publish their seconds: Redis, or (without it, the embedded default) POSTs
    to the control plane; the collector reads them there (settings.REDIS_URL)."""
    settings.REDIS_URL = BROKER if request.param == "redis" else ""
    return settings.REDIS_URL


def selling(*endpoints: Any) -> None:
    forget_metering(redis.Redis.from_url(BROKER))  # an earlier run's seconds
    for e in endpoints:
        sell(e, mu_per_minute=100, best_effort_allowed=True, sold_by="test")


@pytest.mark.django_db(transaction=True)
def test_the_bill_is_the_engines_usage_priced(live_server, sink, profile, owner, other, make_endpoint):
    chat = make_endpoint(owner, "chat", profile=profile)
    cut = make_endpoint(owner, "cut", profile=profile)
    selling(chat, cut)
    _, operator = ApiKey.issue(name="router", tenant=None)
    _, owner_key = ApiKey.issue(name="app", tenant=owner)
    _, other_key = ApiKey.issue(name="app", tenant=other)
    rng = random.Random(7)
    requests, cuts = mix(rng), resets(rng)
    with (
        sim_engine("--profile", "tiny-test", "--time-scale", "20", "--served-model-name", "chat") as main,
        # ~20 ms a token: a stream of 30 outlasts a client that is slow to read its first chunks
        sim_engine("--profile", "tiny-test", "--time-scale", "0.5", "--served-model-name", "cut") as slow,
    ):
        Pod.objects.create(endpoint=chat, name="chat-0", url=main.url, ready=True)
        Pod.objects.create(endpoint=cut, name="cut-0", url=slow.url, ready=True)
        prompt_of = {(p, t): prompt_tokens(main.url, p, t) for p in (COMPLETIONS, CHAT) for t in PROMPTS}
        main_before, slow_before = engine_counts(main.url), engine_counts(slow.url)
        with router_process(live_server.url, sink, operator) as (router, _):
            port = int(router.rsplit(":", 1)[1])

            def send(item: tuple[str, dict[str, Any]]) -> tuple[int, bytes]:
                return call(router + item[0], owner_key, item[1])

            with ThreadPoolExecutor(8) as pool:
                cut_reads = pool.map(lambda c: read_then_reset(port, c[0], c[1], owner_key, c[2]), cuts)
                answers = list(pool.map(send, requests))
                read_by_resets = sum(cut_reads)
            for (_, body), (status, answer) in zip(requests, answers, strict=True):
                assert status == 200, answer
                assert not body.get("stream") or answer.endswith(b"data: [DONE]\n\n"), answer
            # Every request finished at the router, then a second it reported after that (so
            # the second with the last of them is published too).
            wait_until(lambda: in_flight(router) == 0, timeout=10)
            idle = int(time.time())
            wait_until(lambda: published_through(sink, idle + 2), timeout=10)
            main_after, slow_after = engine_counts(main.url), engine_counts(slow.url)
            collect_after(idle + 3)

    base = live_server.url
    billed = totals(usage_rows(base, owner_key, endpoint=chat.pk))
    prefilled, generated = main_after[0] - main_before[0], main_after[1] - main_before[1]
    # The engine's usage counts a prompt once per request, its prefill counter once per choice
    # (vLLM runs n > 1 as n sequences): the bill is the usage, checked against the counter.
    prompt = sum(prompt_of[(path, text_of(body))] for path, body in requests)
    assert prefilled == sum(prompt_of[(path, text_of(body))] * body["n"] for path, body in requests)
    assert billed == {
        "requests": len(requests),
        "tokens_in": prompt,
        "tokens_out": generated,
        "mu": ALPHA * prompt + BETA * generated + GAMMA * len(requests),
        "errors": 0,
        "throttled": 0,
    }
    # The endpoint's buckets carry each request's MU squared (the calm history's measure of how
    # lumpy the work is, calm.work_spread): each request priced as billed, squared, summed. The
    # engine stops at max_tokens (it has no EOS), so each request's tokens are known.
    assert generated == sum(body["max_tokens"] * body["n"] for _, body in requests)
    squares = sum(
        ((ALPHA * prompt_of[(path, text_of(body))] + BETA * body["max_tokens"] * body["n"] + GAMMA) / MICRO)
        ** 2
        for path, body in requests
    )
    carried = sum(b.mu_squared_per_minute * b.seconds / 60 for b in LoadBucket.objects.filter(endpoint=chat))
    assert carried == pytest.approx(squares, rel=1e-5)
    cut_billed = totals(usage_rows(base, owner_key, endpoint=cut.pk))
    assert cut_billed["requests"] == RESETS
    # errors are "5xx answers and upstream failures" (the API's help): a client's reset is none
    assert cut_billed["errors"] == 0 and cut_billed["throttled"] == 0
    assert read_by_resets >= RESETS  # each read at least one token before its reset
    assert read_by_resets <= cut_billed["tokens_out"] <= slow_after[1] - slow_before[1]
    assert cut_billed["tokens_in"] == sum(estimate_input_tokens(body, path == CHAT) for path, body, _ in cuts)
    assert cut_billed["mu"] == (
        ALPHA * cut_billed["tokens_in"] + BETA * cut_billed["tokens_out"] + GAMMA * RESETS
    )
    # Another tenant asking for the endpoint's usage gets no rows; the operator the same sums.
    assert usage_rows(base, other_key, endpoint=chat.pk) == []
    assert usage_rows(base, other_key) == []
    assert totals(usage_rows(base, operator, endpoint=chat.pk)) == billed
    assert totals(usage_rows(base, operator, endpoint=cut.pk)) == cut_billed


def stream_until_closed(port: int, path: str, body: dict[str, Any], key: str, started: Any) -> bytes:
    """POST a stream and read it until the router ends or resets the connection; `started` is
    set once its first token chunk arrived."""
    data = json.dumps(body).encode()
    seen = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            b"POST %s HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
            % (path.encode(), key.encode(), len(data), data)
        )
        with contextlib.suppress(ConnectionResetError):
            while part := s.recv(65536):
                seen += part
                if token_chunks(seen):
                    started.set()
    started.set()  # (a stream that failed before its first token fails the test below)
    return seen


def token_chunks(seen: bytes) -> int:
    return len([e for e in seen.split(b"\n\n") if b'"choices": [{' in e and b'"role"' not in e])


@pytest.mark.django_db(transaction=True)
def test_requests_a_stopping_router_drains_are_billed(live_server, sink, profile, owner, make_endpoint):
    """A router stopped (SIGTERM, as on every rollout) while streams are in flight lets them
    finish for its drain timeout, cuts the rest, then exits: what they cost reaches the bill
    though it never reached a second's flush. The stream cut goes to an endpoint and engine of
    its own: the router's own cut, an error that costs nothing, reaches the usage all the same."""
    chat = make_endpoint(owner, "chat", profile=profile)
    long = make_endpoint(owner, "long", profile=profile)
    selling(chat, long)
    _, operator = ApiKey.issue(name="router", tenant=None)
    _, owner_key = ApiKey.issue(name="app", tenant=owner)
    drained = [
        (COMPLETIONS, {"model": "chat", "prompt": "hi", "max_tokens": 6, "stream": True}),
        (
            CHAT,
            {
                "model": "chat",
                "messages": [{"role": "user", "content": "Write a haiku about routers"}],
                "max_tokens": 6,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ),
    ]
    cut = (COMPLETIONS, {"model": "long", "prompt": "Tell me a story", "max_tokens": 200, "stream": True})
    # ~0.2 s a token: 6 tokens outlast the signal and finish within the drain's 3 s, 200 do not
    slow = ("--profile", "tiny-test", "--time-scale", "0.05")
    with (
        sim_engine(*slow, "--served-model-name", "chat") as engine,
        sim_engine(*slow, "--served-model-name", "long") as long_engine,
    ):
        Pod.objects.create(endpoint=chat, name="chat-0", url=engine.url, ready=True)
        Pod.objects.create(endpoint=long, name="long-0", url=long_engine.url, ready=True)
        before, long_before = engine_counts(engine.url), engine_counts(long_engine.url)
        with (
            router_process(live_server.url, sink, operator, "--drain-timeout-s", "3") as (router, proc),
            ThreadPoolExecutor(3) as pool,
        ):
            port = int(router.rsplit(":", 1)[1])
            started = [threading.Event() for _ in range(3)]
            reads = [
                pool.submit(stream_until_closed, port, path, body, owner_key, event)
                for (path, body), event in zip([*drained, cut], started, strict=True)
            ]
            for event in started:
                assert event.wait(timeout=15)
            proc.send_signal(signal.SIGTERM)
            answers = [r.result(timeout=30) for r in reads]
            assert proc.wait(timeout=30) == 0
            stopped = int(time.time())
        after, long_after = engine_counts(engine.url), engine_counts(long_engine.url)
    for answer in answers[:2]:
        assert answer.startswith(b"HTTP/1.1 200")
        assert answer.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")  # then the last (empty) chunk
    assert b"[DONE]" not in answers[2]
    collect_after(stopped)
    billed = totals(usage_rows(live_server.url, owner_key, endpoint=chat.pk))
    prompt, generated = after[0] - before[0], after[1] - before[1]  # n 1: prefill once each
    assert billed == {
        "requests": len(drained),
        "tokens_in": prompt,
        "tokens_out": generated,
        "mu": ALPHA * prompt + BETA * generated + GAMMA * len(drained),
        "errors": 0,
        "throttled": 0,
    }
    cut_billed = totals(usage_rows(live_server.url, owner_key, endpoint=long.pk))
    assert token_chunks(answers[2]) >= 1 and long_after[1] > long_before[1]  # cut mid-stream
    # the router's own cut: an error, for the platform's reasons, billed nothing
    assert (cut_billed["requests"], cut_billed["errors"]) == (1, 1)
    assert (cut_billed["tokens_in"], cut_billed["tokens_out"], cut_billed["mu"]) == (0, 0, 0)


@pytest.mark.django_db(transaction=True)
def test_a_stream_in_flight_at_its_endpoints_delete_is_billed_to_it(
    live_server, sink, profile, owner, make_endpoint
):
    """An operator releases and deletes an endpoint (?release=true) while a stream to it runs:
    its usage reads as before the delete, and the stream, finished and metered after it, is
    added to the deleted endpoint's id, name and tenant."""
    chat = make_endpoint(owner, "chat", profile=profile)
    selling(chat)
    _, operator = ApiKey.issue(name="router", tenant=None)
    _, owner_key = ApiKey.issue(name="app", tenant=owner)
    before_delete = [(COMPLETIONS, {"model": "chat", "prompt": p, "max_tokens": 3}) for p in PROMPTS[:3]]
    in_flight_body = {"model": "chat", "prompt": "Tell me a story", "max_tokens": 15, "stream": True}
    base = live_server.url
    # ~0.2 s a token: the stream outlasts the delete and the routers' next routing table
    slow = ("--profile", "tiny-test", "--time-scale", "0.05")
    with sim_engine(*slow, "--served-model-name", "chat") as engine:
        Pod.objects.create(endpoint=chat, name="chat-0", url=engine.url, ready=True)
        start = engine_counts(engine.url)
        with router_process(base, sink, operator) as (router, _), ThreadPoolExecutor(1) as pool:
            for path, body in before_delete:
                assert call(router + path, owner_key, body)[0] == 200
            mid = engine_counts(engine.url)
            idle = int(time.time())
            wait_until(lambda: published_through(sink, idle + 2), timeout=10)
            collect_after(idle + 3)
            billed = {key: usage_rows(base, key, endpoint=chat.pk) for key in (owner_key, operator)}
            assert totals(billed[operator])["requests"] == len(before_delete)
            # That pass collected through the end of its slot, a few seconds ahead: the stream
            # starts after it, as a pass on the real clock would have it.
            collected = (idle + 3) // samples.BUCKET_S * samples.BUCKET_S + samples.BUCKET_S
            wait_until(lambda: time.time() > collected, timeout=10)

            started = threading.Event()
            port = int(router.rsplit(":", 1)[1])
            stream = pool.submit(stream_until_closed, port, COMPLETIONS, in_flight_body, owner_key, started)
            assert started.wait(timeout=15)
            status, body = call(f"{base}/api/v1/endpoints/{chat.pk}/?release=true", operator, method="DELETE")
            assert status == 204, body
            for key in (owner_key, operator):  # read as before the delete
                assert usage_rows(base, key, endpoint=chat.pk) == billed[key]
            assert stream.result(timeout=30).endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
            wait_until(lambda: in_flight(router) == 0, timeout=10)
            idle = int(time.time())
            wait_until(lambda: published_through(sink, idle + 2), timeout=10)
            end = engine_counts(engine.url)
            collect_after(idle + 3)

    assert end[1] - mid[1] == in_flight_body["max_tokens"]  # the stream ran to its end
    prompt, generated = end[0] - start[0], end[1] - start[1]
    for key in (owner_key, operator):
        rows = usage_rows(base, key, endpoint=chat.pk)
        assert {(r["endpoint_name"], r["tenant"]) for r in rows} == {("chat", "owner")}
        assert totals(rows) == {
            "requests": len(before_delete) + 1,
            "tokens_in": prompt,
            "tokens_out": generated,
            "mu": ALPHA * prompt + BETA * generated + GAMMA * (len(before_delete) + 1),
            "errors": 0,
            "throttled": 0,
        }
