"""How a benchmark sweep talks to an engine: the Driver protocol and its two drivers.

HttpDriver drives any OpenAI-compatible engine (vLLM, or the simulated engine) over HTTP on
kept-alive connections; `connect` builds one from an engine URL. Prompts are token-id lists, so
their length is exact on any engine: ids come from the engine's /tokenize when it has one (vLLM
does), else from a small range every vocabulary has. Each prompt is drawn afresh so prefix
caches do not flatter the numbers. Outputs are forced to length with vLLM's `min_tokens` and
`ignore_eos`. An engine that is down, answers errors or stops answering raises a
`BenchmarkError` naming the shape and the error.

Each step is timed by the engine where it can be: HttpDriver reads the engine's e2e latency
histogram from /metrics before and after the step, and where that histogram accounts for exactly
the step's requests in buckets fine enough (capacity.benchmark.engine_timing), the step's
latencies are the engine's (an open step whose client fell behind its arrival schedule does not
meet the SLO: the engine was offered less); otherwise the client's clock times it, as before. The
simulated engine exports its own clock's latencies in fine buckets, so its figures do not bend
with the machine's load; real vLLM does with `--custom-histogram-buckets` (engine_timing says how).

SimulatedDriver runs the simulated engine's performance model in-process on a virtual clock
(SIMULATED): the same numbers without HTTP, in a fraction of the time.

Time: latencies and durations are engine seconds; `time_scale` is engine seconds per wall
second (a simulated engine run 100x faster says 100).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Protocol
from urllib.parse import urlparse

from capacity.benchmark import engine_timing
from capacity.benchmark.config import SweepConfig
from capacity.benchmark.results import BenchmarkError
from dataplane.runtime.http_client import ClientResponse, Connection, request
from engine_model import perf_model

FALLBACK_TOKEN_IDS = range(100, 1000)  # inside any real vocabulary (the tiny test model has ~2k)
IDLE_REUSE_S = 2.0  # reuse a kept-alive connection only this long after its last answer, s
# vLLM records a finished request's latency just after answering it: /metrics is read again
# this many times, this far apart (wall seconds), until it counts all of a step's requests.
METRICS_TRIES, METRICS_RETRY_S = 5, 0.02
MAX_LATE_SHARE = 0.05  # an open step whose client sent this share of its span late offered less


class Driver(Protocol):
    """How a sweep talks to an engine. Latencies and durations are engine seconds."""

    name: str  # what was measured, for the record: a URL or "simulated:<profile>"
    model: str
    max_model_len: int
    # Whether the engine's own histogram timed the latest step (its latencies exclude the
    # client's time); False: the client's clock timed it.
    last_step_engine_timed: bool

    async def closed(self, shape: tuple[int, int], concurrency: int, total: int) -> tuple[list[float], float]:
        """Hold `concurrency` in flight until `total` complete: (latencies, elapsed)."""
        ...

    async def open(
        self, shape: tuple[int, int], rate: float, count: int, in_flight_bound: float
    ) -> tuple[list[float], int, bool, float]:
        """Poisson arrivals at `rate`: (latencies, sent, saturated, elapsed)."""
        ...


@dataclass
class HttpDriver:
    """A real engine (or the simulated one) over HTTP."""

    name: str
    host: str
    port: int
    model: str
    max_model_len: int
    token_ids: list[int]
    config: SweepConfig
    rng: random.Random = field(default_factory=random.Random)
    _idle: list[tuple[Connection, float]] = field(default_factory=list)  # kept alive; idle since, monotonic s
    engine_timed: bool = True  # read /metrics around each step; off once the engine shows it has none
    steps_engine_timed: int = 0  # steps timed by the engine's histograms
    steps_client_timed: int = 0  # steps timed by the client's clock
    last_step_engine_timed: bool = False  # whether the engine's histogram timed the latest step
    auth: dict[str, str] = field(default_factory=dict)  # the fleet credential a keyed pod asks for

    async def _engine_latencies(self) -> engine_timing.Histogram | None:
        if not self.engine_timed:
            return None
        try:
            response = await request("GET", self.host, self.port, "/metrics", timeout_s=10)
        except (OSError, TimeoutError):
            return None
        histogram = None
        if response.status == 200:
            histogram = engine_timing.Histogram.parse(response.body.decode("utf-8", "replace"))
        if histogram is None:
            self.engine_timed = False  # no such histogram: not worth asking at every step
        return histogram

    async def _timed_by_engine(
        self, before: engine_timing.Histogram | None, completed: int
    ) -> list[float] | None:
        """The step's latencies as the engine timed them, engine seconds; None: use the client's."""
        latencies = None
        for attempt in range(METRICS_TRIES if before is not None else 0):
            if attempt:
                await asyncio.sleep(METRICS_RETRY_S)
            after = await self._engine_latencies()
            if before is None or after is None:
                break
            latencies = engine_timing.step_latencies(before, after, completed)
            if latencies is not None or after.count - before.count >= completed:
                step = after.minus(before)
                if latencies is None and step is not None and round(step.count) == completed:
                    self.engine_timed = False  # its buckets are too wide (vLLM's defaults): for good
                break  # timed, or all counted and still not usable: waiting will not help
        self.last_step_engine_timed = latencies is not None
        if latencies is None:
            self.steps_client_timed += 1
        else:
            self.steps_engine_timed += 1
        return latencies

    async def complete(self, shape: tuple[int, int]) -> float:
        """One request of this shape; its end-to-end latency in engine seconds."""
        prompt = [self.rng.choice(self.token_ids) for _ in range(shape[0])]
        body = json.dumps(
            {
                "model": self.model,
                "prompt": prompt,
                "max_tokens": shape[1],
                "min_tokens": shape[1],
                "ignore_eos": True,
                "temperature": 0.0,
            }
        ).encode()
        started = time.perf_counter()
        try:
            response = await asyncio.wait_for(self._post(body), self.config.request_timeout_s)
        except TimeoutError:
            raise BenchmarkError(
                shape, f"no answer within {self.config.request_timeout_s:g} s: the engine hangs"
            ) from None
        except OSError as exc:
            raise BenchmarkError(shape, f"engine unreachable: {exc}", unreachable=True) from None
        if response.status != 200:
            raise BenchmarkError(shape, f"engine answered {response.status}: {_error_text(response)}")
        return (time.perf_counter() - started) * self.config.time_scale

    async def _post(self, body: bytes) -> ClientResponse:
        """POST /v1/completions on a kept-alive connection (a fresh one per request would cost
        the client more CPU than the engine spends on a small request, on this 2-core machine).

        Servers close idle connections (uvicorn after 5 s), so connections idle longer than
        IDLE_REUSE_S are dropped, and a reused one that the engine closed before answering is
        retried once on a fresh connection.
        """
        now = time.monotonic()
        while self._idle:
            connection, idle_since = self._idle.pop()
            if now - idle_since > IDLE_REUSE_S:
                connection.close()
                continue
            try:
                return await self._exchange(connection, body)
            except ConnectionError:
                break  # closed by the engine while idle: one fresh try below
        return await self._exchange(await Connection.open(self.host, self.port), body)

    async def _exchange(self, connection: Connection, body: bytes) -> ClientResponse:
        try:
            response = await connection.exchange(
                "POST", "/v1/completions", body, {"content-type": "application/json", **self.auth}
            )
        except BaseException:
            connection.close()
            raise
        if connection.reusable:
            self._idle.append((connection, time.monotonic()))
        else:
            connection.close()
        return response

    async def aclose(self) -> None:
        """Close the kept-alive connections and wait until their sockets are: a transport closes
        its socket on the loop's next turn, which never comes when the sweep's loop ends first
        (the socket is then collected unclosed, a ResourceWarning in whatever runs next)."""
        idle, self._idle = self._idle, []
        for connection, _ in idle:
            connection.close()
        waits = [connection.writer.wait_closed() for connection, _ in idle]
        await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), 5)

    async def closed(self, shape: tuple[int, int], concurrency: int, total: int) -> tuple[list[float], float]:
        latencies: list[float] = []
        remaining = iter(range(total))

        async def worker() -> None:
            for _ in remaining:
                latencies.append(await self.complete(shape))

        before = await self._engine_latencies()
        started = time.perf_counter()
        await _all(worker() for _ in range(concurrency))
        elapsed = (time.perf_counter() - started) * self.config.time_scale
        # The duration stays the client's: what it kept in flight is what the engine served.
        # (Little's law on the engine's latencies, sum / C, credited the engine with C in flight
        # while a starved client held fewer: tiny-test 16 x 16 read 1,605 req/min, truly 1,060.)
        engine = await self._timed_by_engine(before, len(latencies))
        return engine if engine is not None else latencies, elapsed

    async def open(
        self, shape: tuple[int, int], rate: float, count: int, in_flight_bound: float
    ) -> tuple[list[float], int, bool, float]:
        loop = asyncio.get_running_loop()
        latencies: list[float] = []
        running: set[asyncio.Task[None]] = set()
        saturated, due, sent, late = False, 0.0, 0, 0.0

        async def one() -> None:
            latencies.append(await self.complete(shape))

        before = await self._engine_latencies()
        start = loop.time()
        try:
            for _ in range(count):
                due += self.rng.expovariate(rate)
                await asyncio.sleep(max(0.0, start + due / self.config.time_scale - loop.time()))
                _raise_failures(running)
                if len(running) > in_flight_bound:
                    saturated = True
                    break
                running.add(asyncio.create_task(one()))
                sent += 1
                late = loop.time() - (start + due / self.config.time_scale)  # wall s behind
            await _all(running)
        finally:
            for task in running:
                task.cancel()
        elapsed = (loop.time() - start) * self.config.time_scale
        engine = await self._timed_by_engine(before, len(latencies))
        if engine is None:
            return latencies, sent, saturated, elapsed
        # The engine's latencies are those of the rate it was offered: a client that sent its
        # last request more than MAX_LATE_SHARE of the step's span late offered less than
        # `rate`, and the step cannot stand for it (as if saturated: not met).
        behind = late * self.config.time_scale > MAX_LATE_SHARE * due
        return engine, sent, saturated or behind, elapsed


@dataclass
class SimulatedDriver:
    """The simulated engine's performance model run in-process on a virtual clock (SIMULATED).

    The same numbers the simulated HTTP engine produces, without HTTP: a sweep of a fast engine
    profile finishes in seconds, and the true capacities are known, so fit accuracy can be
    measured. It never stands in for a real engine: its name says "simulated".
    """

    profile: perf_model.EngineProfile
    seed: int = 0
    name: str = ""
    model: str = ""
    max_model_len: int = 0
    # Latencies on the virtual clock hold no client time, but nor can a client bound them.
    last_step_engine_timed: bool = False

    elapsed_s: float = 0.0  # engine seconds simulated so far: the sweep's clock, load-proof

    def __post_init__(self) -> None:
        self.name = f"simulated:{self.profile.name} (in-process performance model, virtual clock)"
        self.model, self.max_model_len = self.profile.model, self.profile.max_model_len
        self._rng = random.Random(self.seed)
        self._ids = itertools.count()

    def _request(self, shape: tuple[int, int]) -> perf_model.SimRequest:
        return perf_model.SimRequest(f"r{next(self._ids)}", shape[0], shape[1])

    async def closed(self, shape: tuple[int, int], concurrency: int, total: int) -> tuple[list[float], float]:
        state, now = perf_model.EngineState(), 0.0
        latencies: list[float] = []
        arrived: dict[str, float] = {}
        for _ in range(min(concurrency, total)):
            req = self._request(shape)
            perf_model.submit(state, req)
            arrived[req.request_id] = now
        submitted = min(concurrency, total)
        while len(latencies) < total:
            result = perf_model.step(self.profile, state)
            if result is None:
                raise BenchmarkError(shape, "the simulated engine went idle with requests outstanding")
            now += result.duration_s
            for req in result.finished:
                latencies.append(now - arrived.pop(req.request_id))
                if submitted < total:
                    nxt = self._request(shape)
                    perf_model.submit(state, nxt)
                    arrived[nxt.request_id] = now
                    submitted += 1
        self.elapsed_s += now
        return latencies, now

    async def open(
        self, shape: tuple[int, int], rate: float, count: int, in_flight_bound: float
    ) -> tuple[list[float], int, bool, float]:
        times, t = [], 0.0
        for _ in range(count):
            t += self._rng.expovariate(rate)
            times.append(t)
        state, now = perf_model.EngineState(), 0.0
        latencies: list[float] = []
        arrived: dict[str, float] = {}
        sent, saturated = 0, False
        while True:
            while sent < len(times) and times[sent] <= now and not saturated:
                if len(arrived) > in_flight_bound:
                    saturated = True
                    break
                req = self._request(shape)
                perf_model.submit(state, req)
                arrived[req.request_id] = times[sent]
                sent += 1
            result = perf_model.step(self.profile, state)
            if result is None:
                if sent >= len(times) or saturated:
                    self.elapsed_s += now
                    return latencies, sent, saturated, now
                now = times[sent]
                continue
            now += result.duration_s
            for req in result.finished:
                latencies.append(now - arrived.pop(req.request_id))


async def connect(engine_url: str, config: SweepConfig, api_key: str = "") -> HttpDriver:
    """A driver for the engine at ``engine_url``; ``api_key``: the fleet credential that a keyed
    pod (vLLM's --api-key, the simulated engine's alike) answers only to."""
    auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
    url = urlparse(engine_url)
    if url.scheme != "http" or not url.hostname:
        raise BenchmarkError(None, f"engine URL must be http://host:port, got {engine_url!r}")
    host, port = url.hostname, url.port or 80
    try:
        models = await request("GET", host, port, "/v1/models", headers=auth, timeout_s=10)
    except (OSError, TimeoutError) as exc:
        raise BenchmarkError(None, f"engine at {engine_url} unreachable: {exc!r}", unreachable=True) from None
    if models.status != 200:
        raise BenchmarkError(None, f"GET /v1/models answered {models.status}: {_error_text(models)}")
    card = models.json()["data"][0]
    model, max_len = card["id"], int(card.get("max_model_len") or 1 << 30)
    if card.get("time_scale") and config.time_scale == 1.0:
        # A simulated engine says how much faster than real time it runs; measure in its time.
        config = SweepConfig(**{**asdict(config), "time_scale": float(card["time_scale"])})
    token_ids = list(FALLBACK_TOKEN_IDS)
    try:
        sample = " ".join(["capacity", "planning", "with", "model", "units", "for", "every", "tenant"] * 8)
        tokenized = await request(
            "POST",
            host,
            port,
            "/tokenize",
            body=json.dumps({"model": model, "prompt": sample}).encode(),
            headers={"content-type": "application/json", **auth},
            timeout_s=10,
        )
        if tokenized.status == 200 and tokenized.json().get("tokens"):
            token_ids = sorted(set(tokenized.json()["tokens"]))
    except (OSError, TimeoutError, ValueError):
        pass  # no tokenizer endpoint: the fallback ids serve
    return HttpDriver(
        engine_url, host, port, model, max_len, token_ids, config, random.Random(config.seed), auth=auth
    )


async def _all(awaitables) -> None:  # type: ignore[no-untyped-def]
    """Await all; the first BenchmarkError (the engine failed) is raised after all settle."""
    outcomes = await asyncio.gather(*awaitables, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


def _raise_failures(running: set[asyncio.Task[None]]) -> None:
    for task in [t for t in running if t.done()]:
        running.discard(task)
        if task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def _error_text(response: ClientResponse) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.body[:200].decode("utf-8", "replace")
    error = body.get("error", body) if isinstance(body, dict) else body
    return str(error.get("message", error) if isinstance(error, dict) else error)[:300]
