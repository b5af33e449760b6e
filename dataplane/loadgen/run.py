"""The load generator's I/O: one ``httpx.AsyncClient`` per run, its connections kept alive, and
the clock. Closed-loop stages and open-loop trace replay both record into a ``Progress`` that
a reporter prints every REPORT_EVERY_S, then as a total line; the measuring is in ``measure``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from dataplane.loadgen.measure import CONNECT_BACK_OFF_S, Outcome, StreamReading, Tally, answered, refused
from dataplane.loadgen.trace import TraceRequest, prompt_of

COMPLETIONS = "/v1/completions"
REPORT_EVERY_S = 5.0


def completion_body(model: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    """A completion request; a stream asks for its usage chunk, as the SDKs' clients can."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def open_client(url: str, key: str, connections: int, timeout_s: float) -> httpx.AsyncClient:
    """The run's one client: up to ``connections`` kept-alive connections to ``url``. Each read,
    connect or write may take the whole request's timeout (a long prompt's prefill under load)."""
    return httpx.AsyncClient(
        base_url=url,
        headers={"authorization": f"Bearer {key}"},
        timeout=httpx.Timeout(timeout_s),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


async def unreachable(client: httpx.AsyncClient) -> str | None:
    """Why nothing answers at the client's URL (any HTTP answer will do), or None."""
    try:
        await client.get("/health")
    except httpx.TransportError as exc:
        # The root cause says more than httpx's "All connection attempts failed": "Connection
        # refused", "Name or service not known".
        root: BaseException = exc
        while (inner := root.__cause__ or root.__context__) is not None:
            root = inner
        if isinstance(root, OSError) and root.errno and root.errno > 0:
            return os.strerror(root.errno)  # asyncio's refusal reads "Connect call failed (...)"
        return (isinstance(root, OSError) and root.strerror) or str(root) or type(root).__name__
    return None


async def send(client: httpx.AsyncClient, body: dict[str, Any], timeout_s: float) -> Outcome:
    """One completion, read to the end of its body so that its connection goes back to the pool."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s), client.stream("POST", COMPLETIONS, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return refused(
                    response.status_code, response.headers.get("retry-after"), started, time.monotonic()
                )
            if not body.get("stream"):
                return answered(await response.aread(), started, time.monotonic())
            reading = StreamReading()
            async for line in response.aiter_lines():
                reading.feed(time.monotonic(), line)
        return reading.outcome(started, time.monotonic())
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        return Outcome(type(exc).__name__, started, time.monotonic(), back_off_s=CONNECT_BACK_OFF_S)
    except (httpx.HTTPError, TimeoutError) as exc:
        return Outcome(type(exc).__name__, started, time.monotonic())


@dataclass
class Progress:
    """What the reporter prints: this period's requests, the run's, and the load right now."""

    started_s: float = field(default_factory=time.monotonic)  # monotonic s
    load: str = ""  # e.g. "clients  24" or "in flight  12", set by the driver
    period: Tally = field(default_factory=Tally)
    total: Tally = field(default_factory=Tally)

    def sending(self) -> None:
        self.period.sent += 1

    def record(self, outcome: Outcome) -> None:
        self.period.record(outcome)


async def report(work: Awaitable[None], progress: Progress, say: Callable[[str], None]) -> Tally:
    """Run ``work``, saying one line per REPORT_EVERY_S and the total at the end, also when the
    run is cancelled (Ctrl-C): then the requests in flight are abandoned, the finished ones count."""
    task = asyncio.ensure_future(work)
    last = progress.started_s
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=REPORT_EVERY_S)
            now = time.monotonic()
            say(progress.period.line(f"{now - progress.started_s:6.0f}s {progress.load}", now - last))
            progress.total.add(progress.period)
            progress.period, last = Tally(), now
        task.result()  # a driver's failure is a bug: let it show
    finally:
        task.cancel()  # a no-op once it is done
        progress.total.add(progress.period)
        elapsed = time.monotonic() - progress.started_s
        say("total " + progress.total.line(f"{elapsed:.0f}s", elapsed))
    return progress.total


async def run_stages(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    stages: list[tuple[float, int]],
    timeout_s: float,
    progress: Progress,
) -> None:
    """Closed loop: in each stage SECONDS x CLIENTS, each client sends, waits for the whole
    answer and sends again until the stage's end (the last answers are awaited)."""

    async def closed_loop_client(until: float) -> None:
        while time.monotonic() < until:
            progress.sending()
            outcome = await send(client, body, timeout_s)
            progress.record(outcome)
            if outcome.back_off_s:
                await asyncio.sleep(outcome.back_off_s)

    for seconds, clients in stages:
        progress.load = f"clients {clients:3d}"
        until = time.monotonic() + seconds
        await asyncio.gather(*(closed_loop_client(until) for _ in range(clients)))
        await asyncio.sleep(max(0.0, until - time.monotonic()))  # a stage of 0 clients is a pause


async def replay(
    client: httpx.AsyncClient,
    model: str,
    stream: bool,
    due: list[tuple[float, TraceRequest]],
    max_concurrency: int,
    timeout_s: float,
    progress: Progress,
) -> None:
    """Open loop: each request at its offset into the run, whatever the answers before it did;
    one due while max_concurrency are in flight waits for a slot (as vLLM's benchmark's
    ``--max-concurrency`` does), and so may every one due after it."""
    slots = asyncio.Semaphore(max_concurrency)
    in_flight: set[asyncio.Task[None]] = set()

    async def one(request: TraceRequest) -> None:
        body = completion_body(model, prompt_of(request.context_tokens), request.generated_tokens, stream)
        try:
            progress.record(await send(client, body, timeout_s))
        finally:
            slots.release()

    def finished(task: asyncio.Task[None]) -> None:
        in_flight.discard(task)
        progress.load = f"in flight {len(in_flight):3d}"

    for at, request in due:
        await asyncio.sleep(max(0.0, progress.started_s + at - time.monotonic()))
        await slots.acquire()
        progress.sending()
        task = asyncio.create_task(one(request))
        in_flight.add(task)
        task.add_done_callback(finished)
        progress.load = f"in flight {len(in_flight):3d}"
    await asyncio.gather(*in_flight)
