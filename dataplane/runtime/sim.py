"""SIMULATED inference engine: speaks vLLM's OpenAI API, runs no model, needs no GPU.

    python -m dataplane.runtime.sim --port 8000 --profile h100-llama-8b [--time-scale 100]
    python -m dataplane.runtime.sim --list-profiles        # the profiles, one per line

It stands in for a GPU in tests, what-if runs and fleet-scale benchmarks, and says so (startup
log, ``x-engine: simulated``, the model card, a ``simulated-<profile>`` system_fingerprint). It
reads requests as vLLM does (``openai_api``), answers in vLLM's shapes (``openai_responses``) and
times them with ``perf_model``; its clock advances by exactly each step's simulated duration, so
the latencies it reports are the profile's, not the loaded machine's. Clock, faults and keys:
docs/runtime-pods.md, "The simulated engine".
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import math
import os
import random
import signal
import sys
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field, replace

import uvloop

from dataplane.runtime import engine_auth, metrics, openai_api, openai_responses, sim_generation
from dataplane.runtime.http_server import (
    HttpServer,
    Request,
    Response,
    StreamingResponse,
    json_response,
)
from dataplane.runtime.openai_request import ApiError, ParsedRequest, ServedModel
from dataplane.runtime.prefix_cache import BLOCK_SIZE, PrefixCache
from dataplane.runtime.sim_generation import SequenceOutput
from dataplane.wire.prometheus_text import family_header, label_value
from engine_model import perf_model
from engine_model.profiles import PROFILES, get_profile
from engine_model.vision import PROCESSORS, with_preprocessing

log = logging.getLogger("dataplane.runtime.sim")

FAULT_MODES = ("none", "hang", "crash", "slow", "errors")
CRASH_EXIT_CODE = 70  # exit status of an injected crash
MAX_CATCH_UP_S = 0.05  # most real time the engine loop catches up after running late, s
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"  # what vLLM's (Starlette's) streams send


@dataclass(frozen=True)
class SimConfig:
    time_scale: float = 1.0  # simulated seconds per real second, > 0 (100 = 100x faster)
    # Output tokens of a chat request that sets none, tokens. vLLM gives it the context left and
    # a real model stops at its EOS; the sim has no EOS. (Completions default to 16, as vLLM's.)
    default_max_tokens: int = 256
    seed: int = 0  # seeds the "errors" fault's choice of requests, and unseeded sampling
    crash_delay_s: float = 0.05  # real seconds between answering a crash request and exiting
    # vLLM's automatic prefix caching and --enable-prompt-tokens-details: cached prompt tokens
    # skip prefill, and usage says how many. vLLM V1 caches by default; the sim only when asked
    # (--enable-prefix-caching), so that a repeated prompt takes the time its profile says.
    prefix_caching: bool = False
    prompt_tokens_details: bool = False

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
    """One request in flight: the engine loop pushes (choice, token position) as its sequences
    generate, then None when all of them are done."""

    parsed: ParsedRequest
    outputs: list[SequenceOutput]  # what each choice generates, decided when the request arrives
    arrival_s: float  # simulated seconds
    sequence_ids: list[str] = field(default_factory=list)  # the engine's ids of its sequences
    unfinished: int = 0  # sequences still generating
    cached_tokens: int = 0  # prompt tokens the prefix cache held, over its prompts
    events: asyncio.Queue[tuple[int, int] | None] = field(default_factory=asyncio.Queue)


@dataclass
class _Sequence:
    """One choice of a request, as the engine runs it."""

    live: _Live
    choice: int  # index into live.outputs
    first_token_s: float | None = None  # simulated seconds
    last_token_s: float | None = None


class SimEngine:
    def __init__(
        self,
        profile: perf_model.EngineProfile,
        config: SimConfig | None = None,
        fault: Fault | None = None,
        on_crash: Callable[[], None] | None = None,
        api_keys: list[str] | None = None,
        fault_injection: bool = False,
    ):
        self.profile = profile
        self.config = config or SimConfig()
        self.fault = fault or Fault()
        self.on_crash = on_crash or (lambda: os._exit(CRASH_EXIT_CODE))
        self.key_digests = engine_auth.digests(api_keys or [])  # empty: open, as vLLM without a key
        self.fault_injection = fault_injection  # POST/GET /_sim/fault served; else 404
        self.state = perf_model.EngineState()
        self.sequences: dict[str, _Sequence] = {}  # by the engine's sequence id
        self.served = ServedModel(
            profile.model, profile.max_model_len, self.config.default_max_tokens, profile.vision
        )
        self.fingerprint = f"simulated-{profile.name}"  # system_fingerprint (vLLM: version and config)
        # The prefix cache's blocks: the KV cache's, as vLLM's cached blocks are its free KV blocks.
        self.prefix_cache = PrefixCache(
            profile.kv_capacity_tokens // BLOCK_SIZE if self.config.prefix_caching else 0
        )
        self._ids = itertools.count()
        self._rng = random.Random(self.config.seed)
        self._sampling_rng = random.Random(f"sampling:{self.config.seed}")
        self._wakeup = asyncio.Event()  # set while there may be work
        self._not_hung = asyncio.Event()
        # The engine clock (sim_now): engine seconds `_clock_s` at monotonic `_clock_wall`, then
        # running with the wall clock for at most `_clock_run_s` more (a step's duration; 0
        # between back-to-back steps; inf while idle or hung).
        self._clock_s, self._clock_wall, self._clock_run_s = 0.0, time.monotonic(), math.inf
        self._loop_task: asyncio.Task[None] | None = None
        self.http = HttpServer(self.handle, extra_headers={"x-engine": "simulated"})
        # Metrics, in vLLM's names.
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        # By finished_reason; "stop" appears with the first stop string (vLLM lists all five at 0).
        self.success_total: dict[str, int] = {"length": 0}
        self.e2e = metrics.Histogram(metrics.BENCHMARK_LATENCY_BUCKETS)
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
        """Simulated seconds since start, on the engine's clock (see the module's docstring)."""
        ran = (time.monotonic() - self._clock_wall) * self.config.time_scale
        return self._clock_s + min(ran, self._clock_run_s)

    def _set_clock(self, engine_s: float, run_s: float) -> None:
        self._clock_s, self._clock_wall, self._clock_run_s = engine_s, time.monotonic(), run_s

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
            if not (self._wakeup.is_set() and self._not_hung.is_set()):
                self._set_clock(self.sim_now(), math.inf)  # idle or hung: time runs with the wall
            await self._wakeup.wait()
            await self._not_hung.wait()
            result = perf_model.step(self.profile, self.state)
            if result is None:
                self._wakeup.clear()
                deadline = None
                continue
            duration = result.duration_s * (self.fault.factor if self.fault.mode == "slow" else 1)
            started_s = self.sim_now()
            self._set_clock(started_s, duration)
            # Back-to-back steps run on an absolute schedule, so loop overhead is caught up
            # instead of accumulating (at 100x a 6 ms step is 60 us of real time); at most
            # MAX_CATCH_UP_S is caught up, and never across an idle period or a hang.
            now = time.monotonic()
            if deadline is None or deadline < now - MAX_CATCH_UP_S:
                deadline = now
            deadline += duration / self.config.time_scale
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            self._set_clock(started_s + duration, 0.0)  # the step's end, until the next one starts
            self._deliver(result)

    def _deliver(self, result: perf_model.StepResult) -> None:
        now = self.sim_now()
        self.prompt_tokens_total += result.prefilled_tokens
        self.generation_tokens_total += len(result.emitted)
        for req in result.emitted:
            seq = self.sequences.get(req.request_id)
            if seq is None:
                continue
            if seq.first_token_s is None:
                seq.first_token_s = now
                self.ttft.observe(now - seq.live.arrival_s)
            elif seq.last_token_s is not None:
                self.itl.observe(now - seq.last_token_s)
            seq.last_token_s = now
            seq.live.events.put_nowait((seq.choice, req.generated - 1))
        for req in result.finished:
            seq = self.sequences.pop(req.request_id, None)
            if seq is None:
                continue
            reason = seq.live.outputs[seq.choice].finish_reason
            self.success_total[reason] = self.success_total.get(reason, 0) + 1
            self.e2e.observe(now - seq.live.arrival_s)
            seq.live.unfinished -= 1
            if seq.live.unfinished == 0:
                seq.live.events.put_nowait(None)

    # --- HTTP ---

    async def handle(self, request: Request) -> Response | StreamingResponse:
        route = (request.method, request.path)
        if (
            self.key_digests
            and not engine_auth.is_public(request.path)
            and not engine_auth.authorized(request.headers.get("authorization"), self.key_digests)
        ):
            return json_response(401, engine_auth.UNAUTHORIZED_BODY)
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
                    openai_responses.models_body(
                        self.profile.model,
                        self.profile.max_model_len,
                        int(time.time()),
                        os.urandom(8).hex(),
                        self.profile.name,
                        self.config.time_scale,
                    ),
                )
            if route == ("POST", "/tokenize"):
                tokenized = openai_api.parse_tokenize(request.body, _content_type(request), self.served)
                return json_response(
                    200,
                    openai_responses.tokenize_body(
                        tokenized.token_ids, self.served.max_model_len, tokenized.return_token_strs
                    ),
                )
            if route == ("POST", "/detokenize"):
                ids = openai_api.parse_detokenize(request.body, _content_type(request), self.served)
                return json_response(200, openai_responses.detokenize_body(ids))
            if route == ("GET", "/metrics"):
                return Response(
                    200, self.render_metrics().encode(), "text/plain; version=0.0.4; charset=utf-8"
                )
            if route == ("POST", "/_sim/fault") and self.fault_injection:
                try:
                    body = request.json()
                except ValueError:
                    raise ApiError(400, "JSON decode error", param="body") from None
                self.set_fault(Fault.parse(body))
                log.warning("SIMULATED ENGINE: fault set to %s", self.fault)
                return json_response(200, self._fault_body())
            if route == ("GET", "/_sim/fault") and self.fault_injection:
                return json_response(200, self._fault_body())
            raise ApiError(404, "Not Found", "NotFoundError")
        except ApiError as err:
            return json_response(err.status, err.body())

    def _fault_body(self) -> dict[str, object]:
        return {"mode": self.fault.mode, "factor": self.fault.factor, "fraction": self.fault.fraction}

    async def _completion(self, request: Request, chat: bool) -> Response | StreamingResponse:
        parsed = openai_api.parse_request(request.body, _content_type(request), chat, self.served)
        if self.fault.mode == "errors" and self._rng.random() < self.fault.fraction:
            raise ApiError(500, "Simulated engine error (fault injection).", "InternalServerError")
        # vLLM names a request after the client's X-Request-Id when it sends one.
        base_id = request.headers.get("x-request-id") or f"sim-{next(self._ids)}"
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{base_id}"
        created = int(time.time())
        if parsed.engine_error is not None:
            if not parsed.stream:
                raise parsed.engine_error
            # A stream has answered 200 before the engine refuses: the error is its first event.
            return StreamingResponse(200, SSE_CONTENT_TYPE, _error_events(parsed.engine_error))
        live = self._submit(parsed)
        if parsed.stream:
            return StreamingResponse(200, SSE_CONTENT_TYPE, self._sse_events(live, request_id, created))
        try:
            while await live.events.get() is not None:
                pass
        except asyncio.CancelledError:
            self._abort(live)
            raise
        body = openai_responses.full_response(
            parsed, live.outputs, request_id, created, self.fingerprint, self._details(live)
        )
        return json_response(200, body)

    def _submit(self, parsed: ParsedRequest) -> _Live:
        """Decide what each choice generates, and queue each as a sequence of the engine."""
        outputs = [
            sim_generation.generate(
                sim_generation.sequence_rng(
                    prompt.token_ids, parsed.seed, choice, parsed.greedy, self._sampling_rng
                ),
                max_tokens,
                parsed.stop,
                parsed.include_stop_str_in_output,
                parsed.min_tokens,
            )
            for prompt, max_tokens in zip(parsed.prompts, parsed.max_tokens, strict=True)
            for choice in range(parsed.n)
        ]
        live = _Live(parsed, outputs, self.sim_now(), unfinished=len(outputs))
        if not self._wakeup.is_set() and self._not_hung.is_set():
            # Idle until now: the engine starts on it at once in engine time, however late the
            # loaded machine wakes its loop.
            self._set_clock(live.arrival_s, 0.0)
        for index, output in enumerate(outputs):
            sequence_id = f"seq-{next(self._ids)}"
            prompt = parsed.prompts[index // parsed.n]
            live.sequence_ids.append(sequence_id)
            self.sequences[sequence_id] = _Sequence(live, index)
            sim_req = perf_model.SimRequest(
                sequence_id, len(prompt.token_ids), len(output.token_ids), parsed.priority
            )
            if self.config.prefix_caching:
                sim_req.cached_tokens = self.prefix_cache.lookup(prompt.token_ids, parsed.cache_salt)
                if index % parsed.n == 0:  # usage counts each prompt once
                    live.cached_tokens += sim_req.cached_tokens
            vision = self.profile.vision
            if vision is not None and index == 0:  # the images are encoded once per request
                sim_req.encoder_s = sum(vision.encoder_s(w, h) for w, h in parsed.images)
                sim_req.preprocess_s = sum(vision.preprocess_s(w, h) for w, h in parsed.images)
            perf_model.submit(self.state, sim_req)
        self._wakeup.set()
        return live

    def _details(self, live: _Live) -> dict[str, object] | None:
        """usage.prompt_tokens_details, when the engine sends them (--enable-prompt-tokens-details)."""
        if not self.config.prompt_tokens_details:
            return None
        parsed, written = live.parsed, None
        if parsed.chat:  # vLLM's chat usage counts the prompt's local prefix-cache writes (whole
            # blocks); its completions' leaves them unset (PromptTokenUsageInfo(cached_tokens=...))
            fresh = parsed.prompt_tokens - live.cached_tokens
            written = fresh // BLOCK_SIZE * BLOCK_SIZE if self.config.prefix_caching else 0
        return openai_responses.prompt_tokens_details(live.cached_tokens, parsed.image_tokens, written)

    async def _sse_events(self, live: _Live, request_id: str, created: int) -> AsyncGenerator[bytes, None]:
        writer = openai_responses.StreamWriter(
            live.parsed, live.outputs, request_id, created, self.fingerprint, self._details(live)
        )
        try:
            while (event := await live.events.get()) is not None:
                for chunk in writer.token(*event):
                    yield _sse(chunk)
            if (usage := writer.usage_chunk()) is not None:
                yield _sse(usage)
            yield b"data: [DONE]\n\n"
        finally:
            self._abort(live)  # no-op once finished; frees KV if the client left

    def _abort(self, live: _Live) -> None:
        for sequence_id in live.sequence_ids:
            if self.sequences.pop(sequence_id, None) is not None:
                perf_model.abort(self.state, sequence_id)

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
            *family_header(
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
            ),
            f"vllm:prefix_cache_queries_total{{{labels}}} {self.prefix_cache.queries}",
            *family_header(
                "vllm:prefix_cache_hits_total",
                "counter",
                "Prefix cache hits, in terms of number of cached tokens.",
            ),
            f"vllm:prefix_cache_hits_total{{{labels}}} {self.prefix_cache.hits}",
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


async def _error_events(err: ApiError) -> AsyncGenerator[bytes, None]:
    yield _sse(err.body())
    yield b"data: [DONE]\n\n"


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dataplane.runtime.sim", description="SIMULATED vLLM-compatible engine (no model)."
    )
    parser.add_argument("--port", type=int, help="port to serve on (required unless --list-profiles)")
    parser.add_argument(
        "--list-profiles", action="store_true", help="print the simulated profiles, one per line, and exit"
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address")
    parser.add_argument(
        "--profile",
        default="h100-llama-8b",
        choices=sorted(PROFILES),
        help="the engine and GPU it stands for",
    )
    parser.add_argument(
        "--served-model-name", default=None, help="the model name requests use (default: the profile's model)"
    )
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="run this many times faster than the GPU"
    )
    parser.add_argument(
        "--default-max-tokens", type=int, default=256, help="an answer's length when a request sets none"
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the errors fault and unseeded sampling")
    parser.add_argument(
        "--enable-prefix-caching",
        dest="prefix_caching",
        action="store_true",
        help="cache prompt blocks as vLLM does (its default; the sim's is off)",
    )
    parser.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="usage.prompt_tokens_details: cached and image tokens (as vLLM's flag)",
    )
    parser.add_argument(
        "--image-processor",
        choices=PROCESSORS,
        default=None,
        help="a vision profile's CPU preprocessing: fast (torchvision-like) or slow (PIL-like, 10x)",
    )
    parser.add_argument("--omp-threads", type=int, default=None, help="a vision profile's OMP_NUM_THREADS")
    parser.add_argument(
        "--long-prefill-token-threshold",
        type=int,
        default=0,
        help="as vLLM's: most prompt tokens one request prefills a step beside others (0: no cap)",
    )
    parser.add_argument(
        "--api-key",
        nargs="+",
        default=None,
        help="keys a request must bear, as vLLM's flag (argv is public: pods pass $VLLM_API_KEY)",
    )
    parser.add_argument(
        "--enable-fault-injection",
        action="store_true",
        help="serve POST/GET /_sim/fault (tests only; without it the path is 404)",
    )
    parser.add_argument(
        "--fault",
        choices=FAULT_MODES,
        default="none",
        help="a fault to inject (tests and what-if: a hang, a crash, ...)",
    )
    parser.add_argument("--fault-factor", type=float, default=3.0, help="slow: step time x this (>= 1)")
    parser.add_argument(
        "--fault-fraction", type=float, default=0.2, help="errors: this share of requests fails with 500"
    )
    parser.add_argument(
        "--fault-after", type=float, default=0.0, help="real seconds after start before --fault applies"
    )
    args = parser.parse_args(argv)
    if args.port is None and not args.list_profiles:
        parser.error("--port is required")
    try:
        engine_profile(args)
    except ValueError as e:  # e.g. a threshold beyond the profile's context, as vLLM refuses it
        parser.error(str(e))
    return args


def engine_profile(args: argparse.Namespace) -> perf_model.EngineProfile:
    """The profile the engine runs: the named one, with the deployment's vLLM settings."""
    profile = with_preprocessing(
        get_profile(args.profile, args.served_model_name), args.image_processor, args.omp_threads
    )
    return replace(profile, long_prefill_token_threshold=args.long_prefill_token_threshold)


async def serve(args: argparse.Namespace) -> None:
    profile = engine_profile(args)
    config = SimConfig(
        args.time_scale,
        args.default_max_tokens,
        args.seed,
        prefix_caching=args.prefix_caching,
        prompt_tokens_details=args.enable_prompt_tokens_details,
    )
    engine = SimEngine(
        profile,
        config,
        api_keys=engine_auth.engine_keys(args.api_key, os.environ),
        fault_injection=args.enable_fault_injection,
    )
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
    args = parse_args(argv)
    if args.list_profiles:
        sys.stdout.write("".join(f"{name}\n" for name in sorted(PROFILES)))
        return
    uvloop.run(serve(args))


if __name__ == "__main__":
    main()
