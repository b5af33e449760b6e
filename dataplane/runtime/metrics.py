"""Prometheus text exposition: writing the sim's vLLM metrics and reading an engine's counters.

Names, labels and histogram buckets follow vLLM 0.32's ``vllm/v1/metrics`` (counters are
exposed with the ``_total`` suffix, labels ``model_name`` and ``engine``). Pure: no I/O.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# Bucket upper bounds, seconds, as in vllm/v1/metrics/buckets.py.
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
# What the simulated engine's e2e latency histogram uses, and what a benchmark of real vLLM asks
# for (`--custom-histogram-buckets '{"request_latency": [...]}'`): vLLM's bounds and a log grid of
# 5 % steps from 1 ms to 7,680 s (325 bounds), so a sweep can read each step's p99 from the
# engine's own timings to within a few percent (capacity.benchmark.engine_timing). vLLM's
# defaults alone put 5.1 s and 9.9 s in one bucket.
BENCHMARK_LATENCY_BUCKETS = tuple(
    sorted(
        {*REQUEST_LATENCY_BUCKETS}
        | {float(f"{0.001 * 1.05**k:.4g}") for k in range(400) if 0.001 * 1.05**k <= 7680.0}
    )
)
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)

# Counters whose growth proves an engine makes progress (the prober's signal).
PROGRESS_COUNTERS = ("vllm:request_success_total", "vllm:generation_tokens_total")


@dataclass
class Histogram:
    buckets: tuple[float, ...]  # upper bounds, ascending
    counts: list[int] = field(default_factory=list)  # per bucket (not cumulative), +Inf last
    total: float = 0.0  # sum of observations
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def render(self, name: str, labels: str) -> list[str]:
        lines, cumulative = [], 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            cumulative += n
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {cumulative}')
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum{{{labels}}} {self.total}")
        lines.append(f"{name}_count{{{labels}}} {self.count}")
        return lines


def sample_sum(text: str, name: str) -> float | None:
    """Sum of every sample of metric ``name`` (all label sets); None when absent."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        rest = line[len(name) :]
        if rest[:1] not in ("{", " "):
            continue  # a longer name sharing the prefix
        try:
            total += float(line.rsplit(" ", 1)[1])
            found = True
        except (IndexError, ValueError):
            continue
    return total if found else None


def progress_total(text: str) -> float | None:
    """Finished requests + generated tokens; grows while the engine makes progress."""
    values = [v for v in (sample_sum(text, n) for n in PROGRESS_COUNTERS) if v is not None]
    return sum(values) if values else None
