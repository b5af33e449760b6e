"""SIMULATED inference engine: speaks vLLM's OpenAI API, runs no model, needs no GPU.

    python -m dataplane.runtime.sim --port 8000 --profile h100-llama-8b [--time-scale 100]

It stands in for a GPU in tests, what-if runs and fleet-scale benchmarks, and says so: the
startup log, an ``x-engine: simulated`` header on every response and a ``simulated`` field in
the model card. Timing comes from ``perf_model`` (continuous batching, one engine loop); the
text is a fixed word cycle. ``--time-scale X`` runs simulated time X times faster than real
time (metrics report simulated seconds, as the simulated GPU would). Faults can be injected by
flag or ``POST /_sim/fault {"mode": "hang"|"crash"|"slow"|"errors"|"none", "factor": 3.0,
"fraction": 0.2}``: hang stops all progress while /health stays 200 (as a hung vLLM does),
crash exits non-zero, slow multiplies step time, errors fails that fraction of requests with 500.

Idle cost is near zero: the engine loop awaits an event while there is no work, and sleeps
exactly until the end of the current step while there is.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import random
import signal
import sys
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field

import uvloop

from dataplane.runtime import metrics, openai_api, perf_model
from dataplane.runtime.http_server import (
    HttpServer,
    Request,
    Response,
    StreamingResponse,
    json_response,
)
from dataplane.runtime.openai_api import ApiError, ParsedRequest
from dataplane.runtime.profiles import PROFILES, get_profile
from dataplane.wire.prometheus_text import family_header, label_value

log = logging.getLogger("dataplane.runtime.sim")

FAULT_MODES = ("none", "hang", "crash", "slow", "errors")
CRASH_EXIT_CODE = 70  # exit status of an injected crash
MAX_CATCH_UP_S = 0.05  # most real time the engine loop catches up after running late, s


@dataclass(frozen=True)
class SimConfig:
    time_scale: float = 1.0  # simulated seconds per real second, > 0 (100 = 100x faster)
    default_max_tokens: int = 256  # output tokens when a request sets none, tokens
    seed: int = 0  # seeds the "errors" fault's choice of requests
    crash_delay_s: float = 0.05  # real seconds between answering a crash request and exiting

    def __post_init__(self) -> None:
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")


@dataclass
class Fault:
    mode: str = "none"  # one of FAULT_MODES
    factor: float = 3.0  # "slow": step time multiplier, >= 1
    fraction: float = 0.2  # "errors": fraction of requests failed with 500, 0..1

    @classmethod
    def parse(cls, body: object) -> Fault:
        if not isinstance(body, dict) or body.get("mode") not in FAULT_MODES:
            raise ApiError(400, f"mode must be one of {', '.join(FAULT_MODES)}", param="mode")
        try:
            factor = float(body.get("factor", 3.0))
            fraction = float(body.get("fraction", 0.2))
        except (TypeError, ValueError):
            raise ApiError(400, "factor and fraction must be numbers", param="factor") from None
        if factor < 1.0 or not 0.0 <= fraction <= 1.0:
            raise ApiError(400, "factor must be >= 1 and fraction within 0..1", param="factor")
        return cls(str(body["mode"]), factor, fraction)


@dataclass
class _Live:
    """One request in flight: the engine loop pushes token indexes, then None when done."""

    parsed: ParsedRequest
    sim: perf_model.SimRequest
    arrival_s: float  # simulated seconds
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    first_token_s: float | None = None
    last_token_s: float | None = None


class SimEngine:
    def __init__(
        self,
        profile: perf_model.EngineProfile,
        config: SimConfig | None = None,
        fault: Fault | None = None,
        on_crash: Callable[[], None] | None = None,
    ):
        self.profile = profile
        self.config = config or SimConfig()
        self.fault = fault or Fault()
        self.on_crash = on_crash or (lambda: os._exit(CRASH_EXIT_CODE))
        self.state = perf_model.EngineState()
        self.live: dict[str, _Live] = {}
        self._ids = itertools.count()
        self._rng = random.Random(self.config.seed)
        self._wakeup = asyncio.Event()  # set while there may be work
        self._not_hung = asyncio.Event()
        self._t0 = time.monotonic()
        self._created = int(time.time())
        self._loop_task: asyncio.Task[None] | None = None
        self.http = HttpServer(self.handle, extra_headers={"x-engine": "simulated"})
        # Metrics, in vLLM's names.
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.success_total: dict[str, int] = {"length": 0}
        self.e2e = metrics.Histogram(metrics.REQUEST_LATENCY_BUCKETS)
        self.ttft = metrics.Histogram(metrics.TIME_TO_FIRST_TOKEN_BUCKETS)
        self.itl = metrics.Histogram(metrics.INTER_TOKEN_LATENCY_BUCKETS)
        self.set_fault(self.fault)

    # --- lifecycle ---

    async def start(self, host: str, port: int) -> int:
        self._loop_task = asyncio.create_task(self._engine_loop())
        return await self.http.start(host, port)

    async def close(self) -> None:
        await self.http.close()
        if self._loop_task is not None:
            self._loop_task.cancel()

    def sim_now(self) -> float:
        """Simulated seconds since start."""
        return (time.monotonic() - self._t0) * self.config.time_scale

    def set_fault(self, fault: Fault) -> None:
        self.fault = fault
        if fault.mode == "hang":
            self._not_hung.clear()
        else:
            self._not_hung.set()
        if fault.mode == "crash":
            log.error("SIMULATED ENGINE: injected crash, exiting with %d", CRASH_EXIT_CODE)
            asyncio.get_running_loop().call_later(self.config.crash_delay_s, self.on_crash)

    # --- engine loop ---

    async def _engine_loop(self) -> None:
        deadline: float | None = None  # real time the current step ends; None when idle
        while True:
            await self._wakeup.wait()
            await self._not_hung.wait()
            result = perf_model.step(self.profile, self.state)
            if result is None:
                self._wakeup.clear()
                deadline = None
                continue
            duration = result.duration_s * (self.fault.factor if self.fault.mode == "slow" else 1)
            # Back-to-back steps run on an absolute schedule, so loop overhead is caught up
            # instead of accumulating (at 100x a 6 ms step is 60 us of real time); at most
            # MAX_CATCH_UP_S is caught up, and never across an idle period or a hang.
            now = time.monotonic()
            if deadline is None or deadline < now - MAX_CATCH_UP_S:
                deadline = now
            deadline += duration / self.config.time_scale
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            self._deliver(result)

    def _deliver(self, result: perf_model.StepResult) -> None:
        now = self.sim_now()
        self.prompt_tokens_total += result.prefilled_tokens
        self.generation_tokens_total += len(result.emitted)
        for req in result.emitted:
            live = self.live.get(req.request_id)
            if live is None:
                continue
            if live.first_token_s is None:
                live.first_token_s = now
                self.ttft.observe(now - live.arrival_s)
            elif live.last_token_s is not None:
                self.itl.observe(now - live.last_token_s)
            live.last_token_s = now
            live.tokens.put_nowait(req.generated - 1)
        for req in result.finished:
            live = self.live.pop(req.request_id, None)
            if live is None:
                continue
            self.success_total["length"] += 1
            self.e2e.observe(now - live.arrival_s)
            live.tokens.put_nowait(None)

    # --- HTTP ---

    async def handle(self, request: Request) -> Response | StreamingResponse:
        route = (request.method, request.path)
        try:
            if route == ("POST", "/v1/completions"):
                return await self._completion(request, chat=False)
            if route == ("POST", "/v1/chat/completions"):
                return await self._completion(request, chat=True)
            if route == ("GET", "/health"):
                return Response(200, b"", "text/plain")
            if route == ("GET", "/v1/models"):
                return json_response(
                    200,
                    openai_api.models_body(
                        self.profile.model,
                        self.profile.max_model_len,
                        self._created,
                        self.profile.name,
                        self.config.time_scale,
                    ),
                )
            if route == ("GET", "/metrics"):
                return Response(
                    200, self.render_metrics().encode(), "text/plain; version=0.0.4; charset=utf-8"
                )
            if route == ("POST", "/_sim/fault"):
                try:
                    body = json.loads(request.body)
                except ValueError:
                    raise ApiError(400, "JSON decode error", param="body") from None
                self.set_fault(Fault.parse(body))
                log.warning("SIMULATED ENGINE: fault set to %s", self.fault)
                return json_response(200, self._fault_body())
            if route == ("GET", "/_sim/fault"):
                return json_response(200, self._fault_body())
            raise ApiError(404, "Not Found", "NotFoundError")
        except ApiError as err:
            return json_response(err.status, err.body())

    def _fault_body(self) -> dict[str, object]:
        return {"mode": self.fault.mode, "factor": self.fault.factor, "fraction": self.fault.fraction}

    async def _completion(self, request: Request, chat: bool) -> Response | StreamingResponse:
        parsed = openai_api.parse_request(
            request.body, chat, self.profile.model, self.profile.max_model_len, self.config.default_max_tokens
        )
        if self.fault.mode == "errors" and self._rng.random() < self.fault.fraction:
            raise ApiError(500, "Simulated engine error (fault injection).", "InternalServerError")
        prefix = "chatcmpl" if chat else "cmpl"
        request_id = f"{prefix}-sim-{next(self._ids)}"
        sim_req = perf_model.SimRequest(request_id, parsed.prompt_tokens, parsed.max_tokens, parsed.priority)
        live = _Live(parsed, sim_req, self.sim_now())
        self.live[request_id] = live
        perf_model.submit(self.state, sim_req)
        self._wakeup.set()
        if parsed.stream:
            return self._stream(request_id, live)
        try:
            while await live.tokens.get() is not None:
                pass
        except asyncio.CancelledError:
            self._abort(request_id)
            raise
        return json_response(
            200, openai_api.full_response(parsed, request_id, self._created, sim_req.generated, "length")
        )

    def _stream(self, request_id: str, live: _Live) -> StreamingResponse:
        return StreamingResponse(200, "text/event-stream", self._sse_events(request_id, live))

    async def _sse_events(self, request_id: str, live: _Live) -> AsyncGenerator[bytes, None]:
        parsed = live.parsed
        try:
            while (index := await live.tokens.get()) is not None:
                last = index + 1 >= parsed.max_tokens
                yield _sse(
                    openai_api.stream_chunk(
                        parsed, request_id, self._created, index, "length" if last else None
                    )
                )
            if parsed.include_usage:
                yield _sse(openai_api.usage_chunk(parsed, request_id, self._created, live.sim.generated))
            yield b"data: [DONE]\n\n"
        finally:
            self._abort(request_id)  # no-op once finished; frees KV if the client left

    def _abort(self, request_id: str) -> None:
        if self.live.pop(request_id, None) is not None:
            perf_model.abort(self.state, request_id)

    def render_metrics(self) -> str:
        """vLLM's families and HELP texts (vllm/v1/metrics/loggers.py of vllm 0.32.0), label
        values escaped: a served model name is the endpoint's, whatever characters it holds."""
        labels = f'model_name="{label_value(self.profile.model)}",engine="0"'
        waiting = len(self.state.waiting)
        running = len(self.state.running)
        lines = [
            *family_header("vllm:sim_info", "gauge", "Simulated engine (no model, no GPU)."),
            f'vllm:sim_info{{{labels},profile="{label_value(self.profile.name)}"}} 1',
            *family_header(
                "vllm:num_requests_running", "gauge", "Number of requests in model execution batches."
            ),
            f"vllm:num_requests_running{{{labels}}} {running}",
            *family_header(
                "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."
            ),
            f"vllm:num_requests_waiting{{{labels}}} {waiting}",
            *family_header("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
            f"vllm:kv_cache_usage_perc{{{labels}}} {perf_model.kv_usage(self.profile, self.state)}",
            *family_header("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed."),
            f"vllm:prompt_tokens_total{{{labels}}} {self.prompt_tokens_total}",
            *family_header(
                "vllm:generation_tokens_total", "counter", "Number of generation tokens processed."
            ),
            f"vllm:generation_tokens_total{{{labels}}} {self.generation_tokens_total}",
            *family_header(
                "vllm:request_success_total", "counter", "Count of successfully processed requests."
            ),
        ]
        for reason, n in self.success_total.items():
            lines.append(
                f'vllm:request_success_total{{{labels},finished_reason="{label_value(reason)}"}} {n}'
            )
        for name, help_, hist in (
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", self.e2e),
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl),
        ):
            lines += family_header(name, "histogram", help_)
            lines += hist.render(name, labels)
        return "\n".join(lines) + "\n"


def _sse(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dataplane.runtime.sim", description="SIMULATED vLLM-compatible engine (no model)."
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--profile", default="h100-llama-8b", choices=sorted(PROFILES))
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--default-max-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fault", choices=FAULT_MODES, default="none")
    parser.add_argument("--fault-factor", type=float, default=3.0)
    parser.add_argument("--fault-fraction", type=float, default=0.2)
    parser.add_argument(
        "--fault-after", type=float, default=0.0, help="real seconds after start before --fault applies"
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    profile = get_profile(args.profile, args.served_model_name)
    config = SimConfig(args.time_scale, args.default_max_tokens, args.seed)
    engine = SimEngine(profile, config)
    port = await engine.start(args.host, args.port)
    log.warning(
        "SIMULATED ENGINE (no model, no GPU): profile %s serving %r on %s:%d, time scale %gx",
        profile.name,
        profile.model,
        args.host,
        port,
        args.time_scale,
    )
    fault = Fault(args.fault, args.fault_factor, args.fault_fraction)
    if fault.mode != "none":
        asyncio.get_running_loop().call_later(args.fault_after, engine.set_fault, fault)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.warning("SIMULATED ENGINE: shutting down")
    await engine.close()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    # uvloop, as vLLM's uvicorn picks it: measured with bench/runtime_fleet.py-style load, it costs
    # a pod about 2.6 MiB more than asyncio's loop and a third less CPU per request.
    uvloop.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
