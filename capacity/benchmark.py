"""Measure what an engine sustains per request shape, to price its model in model units.

Async, no Django: drives any OpenAI-compatible engine URL (vLLM, or the simulated engine).
For each shape (input tokens, output tokens):

1. closed loop: keep C requests in flight for C = 1, 2, 4, ... and measure throughput, until it
   stops growing (< 5 % more for twice the concurrency), p99 latency passes the SLO, or C hits
   its bound: the best throughput within the SLO is the shape's capacity estimate X;
2. open loop: Poisson arrivals at 0.95, 0.9, 0.8, 0.7, 0.5 x X until a step meets the SLO with
   every request answered; that rate is the sustainable rate R_s. A step stops early when the
   engine saturates (more in flight than Little's law allows at the SLO: rate x SLO x 2).

Closed loops find the knee in few requests; the open-loop check is what production traffic looks
like (arrivals do not wait for completions). Every step is recorded.

Prompts are token-id lists, so their length is exact on any engine: ids come from the engine's
/tokenize when it has one (vLLM does), else from a small range every vocabulary has. Each prompt
is drawn afresh so prefix caches do not flatter the numbers. Outputs are forced to length with
vLLM's `min_tokens` and `ignore_eos`.

Time: `time_scale` is engine seconds per wall second (a simulated engine run 100x faster says
100); rates and latencies are reported in engine time. An engine that is down, answers errors
or stops answering fails the sweep with a `BenchmarkError` naming the shape and the error.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlparse

from capacity.fitting import Fit, Measurement, fit
from dataplane.runtime.minihttp import ClientResponse, request

# A log grid from 16 to 2,048 input tokens and 1 to 512 output tokens, and the ~50/50 shape of
# real-time chat.
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = (
    *((i, o) for i in (16, 128, 512, 2048) for o in (1, 16, 128, 512)),
    (50, 50),
)
FALLBACK_TOKEN_IDS = range(100, 1000)  # inside any real vocabulary (the tiny test model has ~2k)


@dataclass(frozen=True)
class Slo:
    e2e_p99_s: float = 10.0  # p99 end-to-end latency of a request, engine seconds; > 0


OPEN_LOOP_FRACTIONS = (0.95, 0.9, 0.8, 0.7, 0.5)  # of the closed-loop capacity, tried in order


@dataclass(frozen=True)
class SweepConfig:
    shapes: tuple[tuple[int, int], ...] = DEFAULT_SHAPES
    requests_per_concurrency: int = 4  # a closed-loop step sends C x this (at least 16); >= 1
    max_concurrency: int = 512  # the closed loop stops doubling here; >= 1
    requests_per_step: int = 100  # arrivals per open-loop step (enough for a p99); >= 20
    time_scale: float = 1.0  # engine seconds per wall second; > 0
    request_timeout_s: float = 60.0  # wall seconds a request may take before the engine counts as hung
    saturation_factor: float = 2.0  # in flight beyond rate x SLO x this ends a step early; > 1
    seed: int = 0  # arrival times and prompts are reproducible

    def __post_init__(self) -> None:
        if self.requests_per_step < 20:
            raise ValueError(f"requests_per_step must be >= 20, got {self.requests_per_step}")
        if self.requests_per_concurrency < 1 or self.max_concurrency < 1:
            raise ValueError("requests_per_concurrency and max_concurrency must be >= 1")
        if not self.saturation_factor > 1:
            raise ValueError(f"saturation_factor must be > 1, got {self.saturation_factor}")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        for i, o in self.shapes:
            if i < 1 or o < 1:
                raise ValueError(f"shape ({i} in, {o} out): token counts must be >= 1")


@dataclass(frozen=True)
class Step:
    mode: str  # "closed" (concurrency held) or "open" (Poisson arrivals)
    concurrency: int  # closed: requests held in flight; open: 0
    offered_per_s: float  # open: the arrival rate; closed: 0. Engine time
    sent: int  # requests sent (fewer than planned when the step stopped early)
    completed: int
    throughput_per_s: float  # completions per engine second
    p99_e2e_s: float | None  # engine seconds
    saturated: bool  # stopped early: too many in flight
    met_slo: bool


@dataclass(frozen=True)
class ShapeResult:
    input_tokens: int
    output_tokens: int
    sustainable_per_minute: float  # highest rate that met the SLO; 0 if not even one request does
    solo_latency_s: float  # one request alone, engine seconds
    steps: tuple[Step, ...]
    note: str = ""  # why a shape was skipped or gave 0


@dataclass(frozen=True)
class SweepResult:
    engine_url: str
    model: str
    shapes: tuple[ShapeResult, ...]
    wall_s: float  # how long the sweep took

    def measurements(self) -> list[Measurement]:
        return [
            Measurement(s.input_tokens, s.output_tokens, s.sustainable_per_minute)
            for s in self.shapes
            if s.sustainable_per_minute > 0
        ]

    def fit(self, mu_per_replica_minute: float = 100.0) -> Fit:
        return fit(self.measurements(), mu_per_replica_minute)


class BenchmarkError(Exception):
    def __init__(self, shape: tuple[int, int] | None, message: str):
        self.shape = shape
        where = f"shape ({shape[0]} in, {shape[1]} out): " if shape else ""
        super().__init__(f"{where}{message}")


@dataclass
class _Engine:
    host: str
    port: int
    model: str
    max_model_len: int
    token_ids: list[int]
    config: SweepConfig
    rng: random.Random = field(default_factory=random.Random)

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
            response = await request(
                "POST",
                self.host,
                self.port,
                "/v1/completions",
                body=body,
                headers={"content-type": "application/json"},
                timeout_s=self.config.request_timeout_s,
            )
        except TimeoutError:
            raise BenchmarkError(
                shape, f"no answer within {self.config.request_timeout_s:g} s: the engine hangs"
            ) from None
        except OSError as exc:
            raise BenchmarkError(shape, f"engine unreachable: {exc}") from None
        if response.status != 200:
            raise BenchmarkError(shape, f"engine answered {response.status}: {_error_text(response)}")
        return (time.perf_counter() - started) * self.config.time_scale


async def sweep(
    engine_url: str,
    config: SweepConfig = SweepConfig(),
    slo: Slo = Slo(),
    on_shape: Callable[[ShapeResult], None] | None = None,
) -> SweepResult:
    started = time.perf_counter()
    engine = await _connect(engine_url, config)
    results = []
    for shape in config.shapes:
        if shape[0] + shape[1] > engine.max_model_len:
            result = ShapeResult(
                *shape, 0.0, 0.0, (), note=f"longer than max_model_len {engine.max_model_len}"
            )
        else:
            result = await _measure_shape(engine, shape, slo)
        results.append(result)
        if on_shape:
            on_shape(result)
    return SweepResult(engine_url, engine.model, tuple(results), time.perf_counter() - started)


async def _connect(engine_url: str, config: SweepConfig) -> _Engine:
    url = urlparse(engine_url)
    if url.scheme != "http" or not url.hostname:
        raise BenchmarkError(None, f"engine URL must be http://host:port, got {engine_url!r}")
    host, port = url.hostname, url.port or 80
    try:
        models = await request("GET", host, port, "/v1/models", timeout_s=10)
    except (OSError, TimeoutError) as exc:
        raise BenchmarkError(None, f"engine at {engine_url} unreachable: {exc!r}") from None
    if models.status != 200:
        raise BenchmarkError(None, f"GET /v1/models answered {models.status}: {_error_text(models)}")
    card = models.json()["data"][0]
    model, max_len = card["id"], int(card.get("max_model_len") or 1 << 30)
    token_ids = list(FALLBACK_TOKEN_IDS)
    try:
        sample = " ".join(["capacity", "planning", "with", "model", "units", "for", "every", "tenant"] * 8)
        tokenized = await request(
            "POST",
            host,
            port,
            "/tokenize",
            body=json.dumps({"model": model, "prompt": sample}).encode(),
            headers={"content-type": "application/json"},
            timeout_s=10,
        )
        if tokenized.status == 200 and tokenized.json().get("tokens"):
            token_ids = sorted(set(tokenized.json()["tokens"]))
    except (OSError, TimeoutError, ValueError):
        pass  # no tokenizer endpoint: the fallback ids serve
    return _Engine(host, port, model, max_len, token_ids, config, random.Random(config.seed))


async def _measure_shape(engine: _Engine, shape: tuple[int, int], slo: Slo) -> ShapeResult:
    solo = min([await engine.complete(shape) for _ in range(2)])  # the first may pay a warm-up
    if solo > slo.e2e_p99_s:
        return ShapeResult(*shape, 0.0, solo, (), note=f"one request alone takes {solo:.2f} s > SLO")
    cfg = engine.config
    steps: list[Step] = []
    capacity, concurrency = 0.0, 1
    while concurrency <= cfg.max_concurrency:
        step = await _closed_step(engine, shape, concurrency, slo)
        steps.append(step)
        if not step.met_slo:
            break
        grew = step.throughput_per_s > capacity * 1.05
        capacity = max(capacity, step.throughput_per_s)
        if not grew:
            break
        concurrency *= 2
    for fraction in OPEN_LOOP_FRACTIONS:
        step = await _open_step(engine, shape, capacity * fraction, slo)
        steps.append(step)
        if step.met_slo:
            return ShapeResult(*shape, step.offered_per_s * 60, solo, tuple(steps))
    return ShapeResult(*shape, 0.0, solo, tuple(steps), note="no open-loop step met the SLO")


async def _closed_step(engine: _Engine, shape: tuple[int, int], concurrency: int, slo: Slo) -> Step:
    """Hold `concurrency` requests in flight until C x requests_per_concurrency have completed."""
    total = max(16, concurrency * engine.config.requests_per_concurrency)
    latencies: list[float] = []
    remaining = iter(range(total))

    async def worker() -> None:
        for _ in remaining:
            latencies.append(await engine.complete(shape))

    started = time.perf_counter()
    await _all(worker() for _ in range(concurrency))
    elapsed = (time.perf_counter() - started) * engine.config.time_scale
    p99 = _p99(latencies)
    met = p99 is not None and p99 <= slo.e2e_p99_s
    return Step("closed", concurrency, 0.0, total, len(latencies), len(latencies) / elapsed, p99, False, met)


async def _open_step(engine: _Engine, shape: tuple[int, int], rate: float, slo: Slo) -> Step:
    """Poisson arrivals at `rate` (engine time) for requests_per_step requests."""
    cfg = engine.config
    loop = asyncio.get_running_loop()
    start = loop.time()
    in_flight_bound = max(4.0, rate * slo.e2e_p99_s * cfg.saturation_factor)
    latencies: list[float] = []
    running: set[asyncio.Task[None]] = set()
    saturated = False
    due = 0.0  # engine seconds since the step started
    sent = 0

    async def one() -> None:
        latencies.append(await engine.complete(shape))

    try:
        for _ in range(cfg.requests_per_step):
            due += engine.rng.expovariate(rate)
            await asyncio.sleep(max(0.0, start + due / cfg.time_scale - loop.time()))
            _raise_failures(running)
            if len(running) > in_flight_bound:
                saturated = True
                break
            task = asyncio.create_task(one())
            running.add(task)
            sent += 1
        await _all(running)
    finally:
        for task in running:
            task.cancel()
    elapsed = (loop.time() - start) * cfg.time_scale
    p99 = _p99(latencies)
    met = not saturated and p99 is not None and p99 <= slo.e2e_p99_s and len(latencies) == sent
    return Step("open", 0, rate, sent, len(latencies), len(latencies) / elapsed, p99, saturated, met)


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


def _p99(latencies: list[float]) -> float | None:
    if not latencies:
        return None
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def _error_text(response: ClientResponse) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.body[:200].decode("utf-8", "replace")
    error = body.get("error", body) if isinstance(body, dict) else body
    return str(error.get("message", error) if isinstance(error, dict) else error)[:300]


def table(result: SweepResult, fitted: Fit | None = None, mu_per_replica_minute: float = 100.0) -> str:
    """The sweep as a text table: shape, solo latency, sustained rate, measured vs fitted cost."""
    lines = [f"{'in':>6} {'out':>5} {'solo s':>8} {'req/min':>10} {'cost MU':>9} {'fit MU':>9}  note"]
    for s in result.shapes:
        cost = mu_per_replica_minute / s.sustainable_per_minute if s.sustainable_per_minute else math.nan
        predicted = fitted.predict(s.input_tokens, s.output_tokens) if fitted else math.nan
        lines.append(
            f"{s.input_tokens:>6} {s.output_tokens:>5} {s.solo_latency_s:>8.3f}"
            f" {s.sustainable_per_minute:>10.1f} {cost:>9.4f} {predicted:>9.4f}  {s.note}"
        )
    return "\n".join(lines)


def summary(shapes: Sequence[ShapeResult]) -> dict[str, int]:
    return {"shapes": len(shapes), "measured": sum(1 for s in shapes if s.sustainable_per_minute > 0)}
