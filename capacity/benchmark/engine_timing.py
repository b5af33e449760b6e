"""The engine's own timings of a sweep step, from its Prometheus histograms. Pure: no I/O.

A client's clock measures the client too: on a loaded machine its event loop, the kernel and
the HTTP layers add to every latency, and a simulated engine run 20x faster multiplies each of
those milliseconds by 20 (5 s of SLO budget is 250 ms of wall time there). The engine times
every request itself: vLLM's `vllm:e2e_request_latency_seconds` histogram (vllm/v1/metrics/
loggers.py of vllm 0.32), from the request's arrival at the engine to its last token; the
simulated engine serves it in engine seconds. A sweep reads /metrics before and after each step
(`Histogram.parse`), and the difference (`Histogram.minus`) is what the engine did in the step.

A histogram gives counts per bucket, not the latencies. `latencies` spreads each bucket's
requests evenly over the bucket, which places every one within its bucket's width of the truth:
good enough for a p99 against the SLO only where the buckets are narrow. So a step's engine
timings stand only when every bucket that holds its requests is at most `MAX_BUCKET_WIDTH` (10 %)
of its upper bound wide (`resolved`). vLLM's default buckets are far wider (5 to 10 s): a sweep of
real vLLM keeps the client's clock unless vLLM runs with `--custom-histogram-buckets
'{"request_latency": [...]}'` of BENCHMARK_LATENCY_BUCKETS (dataplane.runtime.metrics), which the
simulated engine uses by default. A step in which the engine counted other requests than the
sweep's (another client, a metrics lag) is timed by the client too.

Worked numbers: buckets (1.0, 1.05] holding 2 requests -> latencies 1.0125 and 1.0375 s.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

E2E_FAMILY = "vllm:e2e_request_latency_seconds"
MAX_BUCKET_WIDTH = 0.10  # of a bucket's upper bound: (0.9, 1.0] is 10 % wide, (5, 10] is 50 %
_LE = re.compile(r'le="([^"]+)"')


@dataclass(frozen=True)
class Histogram:
    """One histogram family summed over its label sets (a data-parallel engine has several)."""

    bounds: tuple[float, ...]  # bucket upper bounds, ascending; +Inf last
    cumulative: tuple[float, ...]  # requests at or below each bound
    total_s: float  # sum of the observations, seconds
    count: float  # observations

    @classmethod
    def parse(cls, text: str, family: str = E2E_FAMILY) -> Histogram | None:
        """The family in Prometheus text; None when the engine does not export it."""
        buckets: dict[float, float] = {}
        total, count, found = 0.0, 0.0, False
        for line in text.splitlines():
            if not line.startswith(family):
                continue
            name, _, value = line.rpartition(" ")
            try:
                number = float(value)
            except ValueError:
                continue
            suffix = name[len(family) :].split("{", 1)[0]
            if suffix == "_bucket":
                le = _LE.search(name)
                if le is None:
                    continue
                bound = float(le.group(1))  # "+Inf" parses as inf
                buckets[bound] = buckets.get(bound, 0.0) + number
            elif suffix == "_sum":
                total, found = total + number, True
            elif suffix == "_count":
                count, found = count + number, True
        if not found or not buckets:
            return None
        bounds = tuple(sorted(buckets))
        return cls(bounds, tuple(buckets[b] for b in bounds), total, count)

    def minus(self, earlier: Histogram) -> Histogram | None:
        """What was observed since `earlier`; None if the buckets differ or a counter fell (the
        engine restarted)."""
        if earlier.bounds != self.bounds:
            return None
        cumulative = tuple(a - b for a, b in zip(self.cumulative, earlier.cumulative, strict=True))
        if any(c < 0 for c in cumulative) or self.count < earlier.count:
            return None
        return Histogram(self.bounds, cumulative, self.total_s - earlier.total_s, self.count - earlier.count)

    def resolved(self) -> bool:
        """Whether every bucket that holds an observation is at most MAX_BUCKET_WIDTH wide."""
        low, below = 0.0, 0.0
        for bound, at_or_below in zip(self.bounds, self.cumulative, strict=True):
            if at_or_below > below and (math.isinf(bound) or (bound - low) > MAX_BUCKET_WIDTH * bound):
                return False
            low, below = bound, at_or_below
        return True

    def latencies(self) -> list[float]:
        """Each bucket's observations spread evenly over it, seconds, ascending."""
        out: list[float] = []
        low, below = 0.0, 0.0
        for bound, at_or_below in zip(self.bounds, self.cumulative, strict=True):
            n = round(at_or_below - below)
            out += [low + (k + 0.5) / n * (bound - low) for k in range(n)]
            low, below = bound, at_or_below
        return out


def step_latencies(before: Histogram | None, after: Histogram | None, completed: int) -> list[float] | None:
    """The engine's latencies of a step that completed `completed` requests, seconds; None when
    they cannot stand for the step (not exported, other requests counted, buckets too wide)."""
    if before is None or after is None:
        return None
    step = after.minus(before)
    if step is None or round(step.count) != completed or not step.resolved():
        return None
    return step.latencies()
