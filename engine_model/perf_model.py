"""Performance model of a continuous-batching inference engine (vLLM-like). Pure: no I/O, no clock.

Each step the scheduler admits waiting requests in (priority, arrival) order while a slot and the
KV cache hold them (head of line), then spends its token budget: a token for each decoding
request, the rest on prompt chunks. The step costs

    duration = step_base_s + decode_per_seq_s * decoding_seqs + prefill_per_token_s * prefilled
               + prefill_context_s * (each prefilled token's context: the tokens before it)
               + prefill_step_s (once, if the step prefills at all)

``step`` mutates an ``EngineState`` and returns what happened, for the simulated engine and the
fleet simulator alike. Its scheduling is checked step by step against vLLM 0.32's own
(tests/runtime/test_scheduler_matches_vllm.py): keep the two in step. The rules, vision and the
prefix cache, and what it leaves out: docs/runtime-pods.md, "The performance model".
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from engine_model.vision import VisionProfile


@dataclass(frozen=True)
class EngineProfile:
    name: str  # profile name, e.g. "h100-llama-8b"
    model: str  # served model name reported by /v1/models
    step_base_s: float  # fixed cost of one step, seconds (weights read once per step + overhead)
    decode_per_seq_s: float  # added step time per sequence decoding in the step, seconds
    prefill_per_token_s: float  # added step time per prompt token prefilled, seconds
    max_batched_tokens: int  # token budget of one step (chunked prefill), tokens, >= max_num_seqs
    max_num_seqs: int  # most sequences running at once (vLLM --max-num-seqs), >= 1
    kv_capacity_tokens: int  # KV-cache capacity, tokens, >= max_model_len
    max_model_len: int  # prompt + output limit of one request, tokens
    vision: VisionProfile | None = None  # a vision-language model's image costs; None: text only
    # added step time per prompt token prefilled per token of its prompt before it (attention:
    # a token's cost grows with its context; a p-token prompt adds p(p-1)/2 of it), seconds
    prefill_context_s: float = 0.0
    # added time of a step that prefills any prompt tokens, once, whatever their number (vLLM-CPU:
    # ~3 ms on a 5-ms step; on a GPU a decode-only step replays a full CUDA graph, a step with
    # prompts does not), seconds
    prefill_step_s: float = 0.0
    # most prompt tokens one request prefills a step while others run or wait (vLLM's
    # --long-prefill-token-threshold), tokens; 0: none (vLLM's default), the head takes the budget
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        for name in (
            "step_base_s",
            "decode_per_seq_s",
            "prefill_per_token_s",
            "prefill_context_s",
            "prefill_step_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{self.name}: {name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_batched_tokens", "max_num_seqs", "kv_capacity_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{self.name}: {name} must be >= 1, got {getattr(self, name)}")
        if self.max_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"{self.name}: max_batched_tokens {self.max_batched_tokens} < "
                f"max_num_seqs {self.max_num_seqs}: a full batch could not decode"
            )
        if not 0 <= self.long_prefill_token_threshold <= self.max_model_len:
            raise ValueError(
                f"{self.name}: long_prefill_token_threshold must be in 0..max_model_len "
                f"{self.max_model_len}, got {self.long_prefill_token_threshold}"
            )
        if self.kv_capacity_tokens < self.max_model_len:
            raise ValueError(
                f"{self.name}: kv_capacity_tokens {self.kv_capacity_tokens} < "
                f"max_model_len {self.max_model_len}: a long request never fits"
            )


@dataclass
class SimRequest:
    request_id: str
    prompt_tokens: int  # tokens, >= 1
    max_tokens: int  # output tokens it generates, >= 1
    priority: int = 0  # lower is scheduled earlier (vLLM --scheduling-policy priority)
    arrival_seq: int = 0  # arrival order, set by submit(); breaks priority ties
    prefilled: int = 0  # prompt tokens prefilled so far
    generated: int = 0  # output tokens emitted so far
    cached_tokens: int = 0  # prompt tokens found in the prefix cache: not prefilled, >= 0
    encoder_s: float = 0.0  # GPU seconds of its images' vision encoder, in its first prefill step
    preprocess_s: float = 0.0  # CPU seconds to preprocess its images before it is scheduled
    encoded: bool = False  # its vision encoder ran

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens


@dataclass
class EngineState:
    waiting: list[tuple[int, int, SimRequest]] = field(default_factory=list)  # heap
    running: list[SimRequest] = field(default_factory=list)  # in admission order
    kv_used_tokens: int = 0  # reserved by running requests, tokens
    next_seq: int = 0  # next arrival_seq
    preprocessing: list[SimRequest] = field(default_factory=list)  # FIFO: images on the CPU
    preprocessed_s: float = 0.0  # CPU seconds already spent on the head of ``preprocessing``


@dataclass(frozen=True)
class StepResult:
    duration_s: float  # engine time the step takes, seconds (unscaled)
    decoding_seqs: int  # sequences that decoded one token this step
    prefilled_tokens: int  # prompt tokens prefilled this step
    emitted: tuple[SimRequest, ...]  # requests that produced one output token this step
    finished: tuple[SimRequest, ...]  # requests that completed this step (subset of emitted)


def submit(state: EngineState, request: SimRequest) -> None:
    if request.prompt_tokens < 1 or request.max_tokens < 1:
        raise ValueError(f"request {request.request_id}: prompt and max_tokens must be >= 1")
    request.arrival_seq = state.next_seq
    state.next_seq += 1
    if request.preprocess_s > 0:
        state.preprocessing.append(request)
    else:
        heapq.heappush(state.waiting, (request.priority, request.arrival_seq, request))


def _preprocess(state: EngineState, seconds: float) -> None:
    """Spend ``seconds`` of the CPU on the preprocessing queue, head first; a request whose
    images are ready waits for the scheduler."""
    budget = seconds
    while state.preprocessing:
        head = state.preprocessing[0]
        left = head.preprocess_s - state.preprocessed_s
        if left > budget + 1e-12:
            state.preprocessed_s += budget
            return
        budget -= left
        state.preprocessing.pop(0)
        state.preprocessed_s = 0.0
        heapq.heappush(state.waiting, (head.priority, head.arrival_seq, head))


def abort(state: EngineState, request_id: str) -> bool:
    """Drop a request (client went away); frees its KV. True if it was found."""
    for req in state.running:
        if req.request_id == request_id:
            state.running.remove(req)
            state.kv_used_tokens -= req.kv_tokens
            return True
    for i, (_, _, req) in enumerate(state.waiting):
        if req.request_id == request_id:
            state.waiting.pop(i)
            heapq.heapify(state.waiting)
            return True
    for i, req in enumerate(state.preprocessing):
        if req.request_id == request_id:
            state.preprocessing.pop(i)
            if i == 0:
                state.preprocessed_s = 0.0
            return True
    return False


def has_work(state: EngineState) -> bool:
    return bool(state.running or state.waiting or state.preprocessing)


def _admit(profile: EngineProfile, state: EngineState) -> None:
    while state.waiting and len(state.running) < profile.max_num_seqs:
        head = state.waiting[0][2]
        if state.kv_used_tokens + head.kv_tokens > profile.kv_capacity_tokens:
            return  # head of line waits for KV; lower-priority requests do not jump it
        heapq.heappop(state.waiting)
        state.running.append(head)
        state.kv_used_tokens += head.kv_tokens
        if head.cached_tokens:  # prefix-cache hits are computed already, all but the last token
            head.prefilled = max(head.prefilled, min(head.cached_tokens, head.prompt_tokens - 1))


def step(profile: EngineProfile, state: EngineState) -> StepResult | None:
    """Run one engine step on ``state``; None when there is nothing to run."""
    _admit(profile, state)
    if not state.running:
        if state.preprocessing:  # the GPU idles until the CPU has the next request's images ready
            idle = state.preprocessing[0].preprocess_s - state.preprocessed_s
            _preprocess(state, idle)
            return StepResult(idle, 0, 0, (), ())
        return None
    budget = profile.max_batched_tokens
    decoders = [r for r in state.running if r.prefilled == r.prompt_tokens][:budget]
    budget -= len(decoders)
    cap = long_prefill_cap(profile, len(state.running) + len(state.waiting))
    prefilled = context = 0
    encoder_s = 0.0
    completed_prefill: list[SimRequest] = []
    for req in state.running:
        if budget <= 0:
            break
        if req.prefilled < req.prompt_tokens:
            if not req.encoded:
                req.encoded = True
                encoder_s += req.encoder_s
            chunk = min(budget, req.prompt_tokens - req.prefilled, cap)
            context += context_tokens(req.prefilled, chunk)
            req.prefilled += chunk
            budget -= chunk
            prefilled += chunk
            if req.prefilled == req.prompt_tokens:
                completed_prefill.append(req)
    emitted = decoders + completed_prefill
    finished = []
    for req in emitted:
        req.generated += 1
        if req.generated >= req.max_tokens:
            finished.append(req)
    for req in finished:
        state.running.remove(req)
        state.kv_used_tokens -= req.kv_tokens
    duration = (
        profile.step_base_s
        + profile.decode_per_seq_s * len(decoders)
        + profile.prefill_per_token_s * prefilled
        + profile.prefill_context_s * context
        + (profile.prefill_step_s if prefilled else 0.0)
        + encoder_s
    )
    if state.preprocessing:
        _preprocess(state, duration)
    return StepResult(duration, len(decoders), prefilled, tuple(emitted), tuple(finished))


def context_tokens(prefilled: int, chunk: int) -> int:
    """The context the next `chunk` prompt tokens attend to, summed over them, after `prefilled`:
    each token counts the prompt tokens before it."""
    return chunk * prefilled + chunk * (chunk - 1) // 2


def long_prefill_cap(profile: EngineProfile, requests: int) -> int:
    """Most prompt tokens one request prefills this step, with `requests` running and waiting:
    vLLM's scheduler caps each at --long-prefill-token-threshold, so a long prompt leaves the
    rest of the budget to the prompts behind it, but not when it is alone (no one to starve)."""
    if profile.long_prefill_token_threshold and requests > 1:
        return profile.long_prefill_token_threshold
    return profile.max_batched_tokens


def kv_usage(profile: EngineProfile, state: EngineState) -> float:
    """Fraction of the KV cache reserved, 0..1 (vllm:kv_cache_usage_perc)."""
    return state.kv_used_tokens / profile.kv_capacity_tokens


# --- Closed forms -----------------------------------------------------------------------------


def decode_step_s(profile: EngineProfile, batch: int) -> float:
    """Duration of a pure decode step with ``batch`` sequences, seconds."""
    return profile.step_base_s + profile.decode_per_seq_s * batch


def solo_latency_s(profile: EngineProfile, prompt_tokens: int, output_tokens: int) -> tuple[float, float]:
    """(time to first token, end-to-end latency) of one request alone in the engine, seconds.

    The prompt takes ceil(prompt / budget) steps (the first token comes with the last chunk),
    then output - 1 decode steps at batch 1.
    """
    chunks = math.ceil(prompt_tokens / profile.max_batched_tokens)
    ttft = (
        chunks * (profile.step_base_s + profile.prefill_step_s)
        + profile.prefill_per_token_s * prompt_tokens
        + profile.prefill_context_s * context_tokens(0, prompt_tokens)
    )
    return ttft, ttft + (output_tokens - 1) * decode_step_s(profile, 1)


def max_batch(profile: EngineProfile, prompt_tokens: int, output_tokens: int) -> int:
    """Most requests of this shape that run at once: slots and KV both bound it."""
    return min(profile.max_num_seqs, profile.kv_capacity_tokens // (prompt_tokens + output_tokens))


def steady_state_requests_per_s(
    profile: EngineProfile, prompt_tokens: int, output_tokens: int, batch: int
) -> float:
    """Completed requests per second with ``batch`` requests of one shape always in flight.

    Each slot cycles through 1 prefill step + (output - 1) decode steps, and every step
    advances every slot, so a request's share of engine time is
    output * step_base / batch + (output - 1) * decode_per_seq + prompt * prefill_per_token
    + prompt(prompt-1)/2 * prefill_context + prefill_step / batch (the batch's prompts share
    one step). Exact for the model when batch * prompt fits one step's token budget and the
    batch runs in lockstep (admitted together); with admissions spread over the steps each
    prompt may pay a step's price of its own, up to prefill_step x min(1, output / batch) more.
    """
    most = max_batch(profile, prompt_tokens, output_tokens)
    if not 1 <= batch <= most:
        raise ValueError(f"batch {batch} outside 1..{most} for this shape")
    per_request_s = (
        output_tokens * profile.step_base_s / batch
        + (output_tokens - 1) * profile.decode_per_seq_s
        + prompt_tokens * profile.prefill_per_token_s
        + context_tokens(0, prompt_tokens) * profile.prefill_context_s
        + profile.prefill_step_s / batch
    )
    return 1.0 / per_request_s


# --- Discrete-event driver --------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    time_s: float  # arrival time, seconds since the start of the run
    request: SimRequest


@dataclass(frozen=True)
class Completion:
    request_id: str
    arrival_s: float  # seconds
    first_token_s: float  # seconds
    finished_s: float  # seconds
    prompt_tokens: int
    output_tokens: int


def simulate(profile: EngineProfile, arrivals: list[Arrival], max_steps: int = 1_000_000) -> list[Completion]:
    """Run the engine on ``arrivals`` until all complete; returns completions in finish order.

    A request that arrives during a step is admitted at the next step, as in the live engine.
    Bounded by ``max_steps`` (raises if exceeded, so a bad profile cannot loop for ever).
    """
    state = EngineState()
    pending = sorted(arrivals, key=lambda a: a.time_s)
    arrived: dict[str, float] = {}
    first: dict[str, float] = {}
    done: list[Completion] = []
    now, i = 0.0, 0
    for _ in range(max_steps):
        while i < len(pending) and pending[i].time_s <= now:
            submit(state, pending[i].request)
            arrived[pending[i].request.request_id] = pending[i].time_s
            i += 1
        result = step(profile, state)
        if result is None:
            if i >= len(pending):
                return done
            now = pending[i].time_s
            continue
        now += result.duration_s
        for req in result.emitted:
            first.setdefault(req.request_id, now)
        for req in result.finished:
            done.append(
                Completion(
                    req.request_id,
                    arrived[req.request_id],
                    first[req.request_id],
                    now,
                    req.prompt_tokens,
                    req.generated,
                )
            )
    raise RuntimeError(f"simulate: not done after {max_steps} steps")
