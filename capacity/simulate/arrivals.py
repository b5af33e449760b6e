"""The in-memory trace and the seeded arrival process behind every synthetic one. Pure.

A `Trace` holds `Arrival`s (seconds since the first, prompt and output tokens) in time order
as three columns: 16 bytes an arrival, where a list of `Arrival` objects takes ~150, so that a
simulated day of a 200-replica fleet (~10^8 arrivals) fits in 2 GB. `from_rate` draws a
Poisson process of any rate function by thinning, with chat-like shapes. Apart from
`capacity.simulate.traces` (files, reshaping, the kinds of synthetic trace, the command line)
because this is the part `make sim-native` compiles: a module run with `python -m` cannot be.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, overload

MAX_TOKENS = 2**31 - 1  # a column holds 32-bit counts


class Arrival(NamedTuple):
    time_s: float  # seconds since the trace's first arrival, >= 0
    prompt_tokens: int  # ContextTokens, >= 1
    output_tokens: int  # GeneratedTokens, >= 1


class Trace(Sequence[Arrival]):
    """Arrivals in time order as columns: a list of 10^8 `Arrival` objects would take ~15 GB."""

    __slots__ = ("outputs", "prompts", "times")

    def __init__(self, arrivals: Iterable[Arrival] = ()) -> None:
        self.times = array("d")
        self.prompts = array("i")
        self.outputs = array("i")
        for a in arrivals:
            self.append(*a)

    def append(self, time_s: float, prompt_tokens: int, output_tokens: int) -> None:
        self.times.append(time_s)
        self.prompts.append(prompt_tokens)
        self.outputs.append(output_tokens)

    def extend(self, times: list[float], prompts: list[int], outputs: list[int]) -> None:
        """Columns at once (one C call each, where `append` is three Python calls an arrival)."""
        if not len(times) == len(prompts) == len(outputs):
            raise ValueError(f"columns of {len(times)}, {len(prompts)} and {len(outputs)} arrivals")
        self.times.extend(times)
        self.prompts.extend(prompts)
        self.outputs.extend(outputs)

    def __len__(self) -> int:
        return len(self.times)

    @overload
    def __getitem__(self, index: int) -> Arrival: ...

    @overload
    def __getitem__(self, index: slice) -> Trace: ...

    def __getitem__(self, index: int | slice) -> Arrival | Trace:
        if isinstance(index, slice):
            part = Trace()
            part.times, part.prompts = self.times[index], self.prompts[index]
            part.outputs = self.outputs[index]
            return part
        return Arrival(self.times[index], self.prompts[index], self.outputs[index])

    def __iter__(self) -> Iterator[Arrival]:
        return map(Arrival, self.times, self.prompts, self.outputs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(map(tuple.__eq__, self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list


def as_trace(trace: Sequence[Arrival]) -> Trace:
    """The arrivals as columns: the trace itself when it is a `Trace`, else a copy. One place for
    the check, in this compiled module: from interpreted code, isinstance of the compiled
    `Trace` holds for a list too under `make sim-native`."""
    return trace if isinstance(trace, Trace) else Trace(trace)


# random.lognormvariate's and expovariate's own arithmetic (Python 3.11), written out: the same
# draws from the same seed, without two Python calls per number (a day's trace of a large
# fleet draws ~10^9 of them).
_NV_MAGICCONST = 4 * math.exp(-0.5) / math.sqrt(2.0)
_LOG_PROMPT, _LOG_OUTPUT = math.log(800), math.log(150)


def _lognormal(uniform: Callable[[], float], mu: float, sigma: float) -> float:
    while True:  # Kinderman and Monahan's ratio method
        u1 = uniform()
        u2 = 1.0 - uniform()
        z = _NV_MAGICCONST * (u1 - 0.5) / u2
        if z * z / 4.0 <= -math.log(u2):
            return math.exp(mu + z * sigma)


def _shape(uniform: Callable[[], float]) -> tuple[int, int]:
    """A chat-like shape: log-normal prompt (median ~800) and answer (median ~150), like the
    Azure conversation trace (means 1,155 in / 211 out), clamped to fit an 8k context."""
    prompt = min(6000, max(1, int(_lognormal(uniform, _LOG_PROMPT, 0.8))))
    output = min(1000, max(1, int(_lognormal(uniform, _LOG_OUTPUT, 0.8))))
    return prompt, output


Shape = Callable[[Callable[[], float]], tuple[int, int]]  # uniform draws -> (prompt, output)


class LogNormalShape:
    """Prompt and output lengths, each log-normal from its median and a quantile, clamped:
    `LogNormalShape(1470, 0.9, 5200, 13, 0.9, 55)` is a prefill-heavy mix (RAG, code) whose
    prompts have median 1,470 and p90 5,200 tokens. sigma = ln(quantile / median) / z(q)."""

    __slots__ = ("max_output", "max_prompt", "mu_output", "mu_prompt", "sigma_output", "sigma_prompt")

    def __init__(
        self,
        prompt_median: float,
        prompt_q: float,
        prompt_at_q: float,
        output_median: float,
        output_q: float,
        output_at_q: float,
        max_prompt: int = 6000,
        max_output: int = 1000,
    ) -> None:
        z = _z
        self.mu_prompt = math.log(prompt_median)
        self.sigma_prompt = math.log(prompt_at_q / prompt_median) / z(prompt_q)
        self.mu_output = math.log(output_median)
        self.sigma_output = math.log(output_at_q / output_median) / z(output_q)
        self.max_prompt, self.max_output = max_prompt, max_output

    def __call__(self, uniform: Callable[[], float]) -> tuple[int, int]:
        prompt = min(self.max_prompt, max(1, int(_lognormal(uniform, self.mu_prompt, self.sigma_prompt))))
        output = min(self.max_output, max(1, int(_lognormal(uniform, self.mu_output, self.sigma_output))))
        return prompt, output


def _z(q: float) -> float:
    """The standard normal's q-quantile (0.9 -> 1.2816, 0.99 -> 2.3263), by bisection."""
    lo, hi = -10.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * math.erfc(-mid / math.sqrt(2.0)) < q else (lo, mid)
    return (lo + hi) / 2


def from_rate(rate: Callable[[float], float], seconds: float, seed: int, shape: Shape | None = None) -> Trace:
    """A Poisson process of `rate(t)` requests per second over [0, seconds), by thinning; each
    arrival's lengths from `shape` (default: chat-like, `_shape`)."""
    draw = shape or _shape
    uniform = random.Random(seed).random  # [0, 1)
    peak = max(rate(t / 10.0) for t in range(int(seconds * 10) + 1))
    out = Trace()
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    t = 0.0
    while peak > 0:
        t += -math.log(1.0 - uniform()) / peak  # expovariate(peak)
        if t >= seconds:
            break
        if uniform() * peak < rate(t):
            prompt, output = draw(uniform)
            times.append(t)
            prompts.append(prompt)
            outputs.append(output)
            if len(times) == 65536:  # into the columns in chunks: lists of 10^8 would not fit
                out.extend(times, prompts, outputs)
                times, prompts, outputs = [], [], []
    out.extend(times, prompts, outputs)
    return out
