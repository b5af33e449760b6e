"""One simulated replica: the simulated engine's continuous-batching model, driven by events. Pure.

Same model, second driver: `engine_model.perf_model.step` runs one engine step at a time
(the HTTP engine sleeps each one); a fleet of hundreds of replicas over hours cannot afford a
Python call per step per replica, so this driver jumps. Between two events (an admission or a
completion) the running batch does not change, so every step costs the same
`step_base_s + decode_per_seq_s x batch` and the next completion is k steps away, k being the
fewest output tokens any running request still owes. A replica keeps a counter G of decode
steps run so far and each decoding request its finishing G, in a heap: jumping k steps is
O(log n), not O(n x k). Steps that prefill (a request was just admitted) run one by one with
the perf model's own rule: decoders first, then prompt chunks in admission order within
`max_batched_tokens` (each at most `long_prefill_token_threshold`, vLLM's cap), cost
`+ prefill_per_token_s x prefilled + prefill_context_s x their context + prefill_step_s`, the
first token comes with the last chunk. Admission is vLLM's (and perf_model's): a free slot
(`max_num_seqs`) and room in the KV cache for prompt + output, head of line. Worked numbers
(h100-llama-8b): 64 requests decoding -> 6 ms + 64 x 60 us = 9.84 ms per step; the shortest
owes 100 tokens -> it finishes 0.984 s on.

A request that arrives while a step runs starts at the next step, as in the live engine.
The only divergence from `perf_model.simulate` is that order: none in the arithmetic
(tests/simulate/test_replica_matches_perf_model.py checks it).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from engine_model.perf_model import EngineProfile, context_tokens, long_prefill_cap


class Request:
    """One request through the fleet. A plain class, not a dataclass: a simulated day makes
    10^8 of them, and the compiled build (make sim-native) builds this one natively."""

    __slots__ = (
        "arrival_s",
        "deadline_s",
        "finished_s",
        "first_token_s",
        "mu",
        "output_tokens",
        "prefilled",
        "prompt_tokens",
        "seq",
    )

    def __init__(
        self,
        arrival_s: float,
        prompt_tokens: int,
        output_tokens: int,
        deadline_s: float,
        mu: float,
        seq: int = 0,
    ) -> None:
        self.arrival_s = arrival_s  # when it reached the router, simulated seconds
        self.prompt_tokens = prompt_tokens  # tokens, >= 1
        self.output_tokens = output_tokens  # tokens to generate, >= 1
        self.deadline_s = deadline_s  # the SLO's end-to-end bound for this request, seconds
        self.mu = mu  # model units, priced by the router's CostModel
        self.seq = seq  # arrival order, breaks ties
        self.prefilled = 0  # prompt tokens prefilled so far
        self.first_token_s = math.nan  # simulated seconds, once known
        self.finished_s = math.nan  # simulated seconds, once known

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


def first_token_deadline_s(first_token_s: float, prefill_per_token_s: float, prompt: int) -> float:
    """`first_token_s` of queueing + the prompt's own prefill on an idle replica (`slo_ratios`
    says why)."""
    return first_token_s + prompt * prefill_per_token_s


def end_to_end_deadline_s(
    first_token_s: float, per_output_token_s: float, profile: EngineProfile, prompt: int, output: int
) -> float:
    """The first token's deadline + `per_output_token_s` for each answer token: a 126k-token
    prompt with a one-token answer is due in 5 + 5.04 + 0.1 s, not in 5.1 s."""
    return (
        first_token_deadline_s(first_token_s, profile.prefill_per_token_s, prompt)
        + per_output_token_s * output
    )


def slo_ratios(
    req: Request, first_token_s: float, per_output_token_s: float, prefill_per_token_s: float
) -> tuple[float, float, float]:
    """A finished request against its three deadlines (capacity.benchmark.config.Slo's numbers):
    (end to end / its `deadline_s` (`end_to_end_deadline_s`), TTFT / (first_token_s + the
    prompt's own prefill, prompt x prefill_per_token_s), ITL / per_output_token_s).

    The TTFT deadline is the Slo's 5 s budget for queueing on top of the prompt's prefill on an
    idle replica: a 126k-token prompt takes 5 s to prefill on an H100 by itself, so a flat 5 s
    would be a deadline no fleet meets. ITL is the request's mean gap between answer tokens after
    the first (vLLM's benchmark calls it TPOT): the replica jumps over runs of equal decode
    steps, so it knows a request's first and last token, not every gap. Worked numbers, 5 s and
    0.1 s, 1,000-token prompt at 40 us: arrival 0, first token 1.2 s, 13 tokens done at 4.8 s
    -> (4.8 / 6.34, 1.2 / 5.04, 0.3 / 0.1) = (0.76, 0.24, 3.0): in time end to end and to the
    first token, but decode steps of 0.3 s miss the ITL."""
    e2e = (req.finished_s - req.arrival_s) / req.deadline_s
    ttft = (req.first_token_s - req.arrival_s) / first_token_deadline_s(
        first_token_s, prefill_per_token_s, req.prompt_tokens
    )
    gaps = req.output_tokens - 1
    itl = (req.finished_s - req.first_token_s) / gaps / per_output_token_s if gaps > 0 else 0.0
    return e2e, ttft, itl


def p99(values: list[float]) -> float:
    """The 0.99 quantile (nearest rank) of `values`, sorting them in place; nan when empty."""
    if not values:
        return math.nan
    values.sort()
    return values[min(len(values) - 1, math.ceil(0.99 * len(values)) - 1)]


@dataclass(slots=True)
class Replica:
    profile: EngineProfile
    name: int  # an index, for reports
    ready_at: float  # simulated seconds when the pod passes readiness
    started_at: float  # simulated seconds when it was asked for (GPU time counts from here)
    draining: bool = False  # no new requests; removed once empty
    clock: float = 0.0  # when the engine may start its next step, simulated seconds
    decode_steps: int = 0  # G: decode steps run so far
    kv_used_tokens: int = 0  # reserved by admitted requests, tokens
    in_flight: int = 0  # routed here and not finished (waiting + running)
    in_flight_mu: float = 0.0  # their model units
    unanswered_mu: float = 0.0  # those without a first token yet (the router's view; off by at most a step)
    waiting: deque[Request] = field(default_factory=deque)  # routed, not yet admitted
    prefilling: deque[Request] = field(default_factory=deque)  # admitted, prompt not done
    decoding: list[tuple[int, int, Request]] = field(default_factory=list)  # heap of (finish G, seq, req)

    def submit(self, request: Request, now: float) -> None:
        """Route a request here at `now` (the caller advanced the replica to `now`)."""
        if not self.has_work():
            self.clock = max(self.clock, now)
        self.waiting.append(request)
        self.in_flight += 1
        self.in_flight_mu += request.mu
        self.unanswered_mu += request.mu

    def load_mu(self) -> float:
        """What the router's p2c-mu weighs (dataplane.router.balancer.PodLoad.load_mu): in-flight
        MU, the requests without a first token yet counted again."""
        return self.in_flight_mu + self.unanswered_mu

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    def expire(self, arrived_before: float) -> list[Request]:
        """Drop waiting requests that arrived before this time (their client gave up; vLLM aborts
        a request whose connection closes). FIFO: the head is the oldest."""
        gone: list[Request] = []
        while self.waiting and self.waiting[0].arrival_s < arrived_before:
            req = self.waiting.popleft()
            self.in_flight -= 1
            self.in_flight_mu -= req.mu
            self.unanswered_mu -= req.mu
            gone.append(req)
        return gone

    def blocked(self) -> int:
        """Waiting requests the next step could not admit (no slot, or no KV for the head of line):
        the engine's real queue. Those that merely arrived during the running step are not."""
        p = self.profile
        slots = p.max_num_seqs - self.running()
        kv = self.kv_used_tokens
        admissible = 0
        for req in self.waiting:
            if admissible >= slots or kv + req.kv_tokens > p.kv_capacity_tokens:
                break
            kv += req.kv_tokens
            admissible += 1
        return len(self.waiting) - admissible

    def kv_usage(self) -> float:
        return self.kv_used_tokens / self.profile.kv_capacity_tokens

    def advance_to(self, t: float) -> list[Request]:
        """Run every step that starts before `t`; returns the requests that finished."""
        done: list[Request] = []
        p = self.profile
        # The hot loop of a fleet simulation: attributes are read once per step, not per use.
        waiting, prefilling, decoding = self.waiting, self.prefilling, self.decoding
        while self.clock < t:
            if waiting:
                self._admit()
            if prefilling:
                self._mixed_step(done)
                continue
            if not decoding:
                if waiting:  # head of line cannot fit the KV cache even when empty
                    raise RuntimeError(f"replica {self.name}: request larger than the KV cache")
                self.clock = t  # idle until then
                break
            step_s = p.step_base_s + p.decode_per_seq_s * len(decoding)
            owed = decoding[0][0] - self.decode_steps
            steps = owed if t == math.inf else min(owed, max(1, math.ceil((t - self.clock) / step_s)))
            self.decode_steps += steps
            self.clock += steps * step_s
            if steps == owed:
                self._pop_finished(done)
        return done

    def _admit(self) -> None:
        p = self.profile
        waiting = self.waiting
        slots = p.max_num_seqs - len(self.prefilling) - len(self.decoding)
        while waiting and slots > 0:
            head = waiting[0]
            if self.kv_used_tokens + head.kv_tokens > p.kv_capacity_tokens:
                return  # head of line waits for KV
            waiting.popleft()
            self.kv_used_tokens += head.kv_tokens
            self.prefilling.append(head)
            slots -= 1

    def _mixed_step(self, done: list[Request]) -> None:
        """One step with prompt chunks: exactly perf_model.step's arithmetic."""
        p = self.profile
        decoders = len(self.decoding)
        budget = p.max_batched_tokens - decoders
        prefilling = self.prefilling
        cap = long_prefill_cap(p, decoders + len(prefilling) + len(self.waiting))
        prefilled = context = 0
        completed: list[Request] = []
        for req in prefilling:
            chunk = min(budget, req.prompt_tokens - req.prefilled, cap)
            context += context_tokens(req.prefilled, chunk)
            req.prefilled += chunk
            budget -= chunk
            prefilled += chunk
            if req.prefilled == req.prompt_tokens:
                completed.append(req)
            if budget <= 0:
                break
        for req in completed:  # the leftmost, but where a cap let one behind a long prompt finish
            if prefilling[0] is req:
                prefilling.popleft()
            else:
                prefilling.remove(req)
        self.clock += (
            p.step_base_s
            + p.decode_per_seq_s * decoders
            + p.prefill_per_token_s * prefilled
            + p.prefill_context_s * context
            + p.prefill_step_s
        )
        self.decode_steps += 1
        if self.decoding and self.decoding[0][0] <= self.decode_steps:
            self._pop_finished(done)
        for req in completed:
            req.first_token_s = self.clock
            self.unanswered_mu -= req.mu
            if req.output_tokens == 1:
                self._finish(req, done)
            else:
                heapq.heappush(self.decoding, (self.decode_steps + req.output_tokens - 1, req.seq, req))

    def _pop_finished(self, done: list[Request]) -> None:
        while self.decoding and self.decoding[0][0] <= self.decode_steps:
            self._finish(heapq.heappop(self.decoding)[2], done)

    def _finish(self, req: Request, done: list[Request]) -> None:
        req.finished_s = self.clock
        self.kv_used_tokens -= req.kv_tokens
        self.in_flight -= 1
        self.in_flight_mu -= req.mu
        done.append(req)
