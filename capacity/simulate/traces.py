"""Traces of arrivals with token counts: load, reshape, generate. Pure (files only in `load`/`save`).

A trace is the CSV of the shared Azure sample: TIMESTAMP ("2023-11-16 18:15:46.6805900"),
ContextTokens, GeneratedTokens. In memory it is a `Trace` (`capacity.simulate.arrivals`):
`Arrival`s sorted by seconds since the trace's first arrival. `amplify(trace, 10)` replays
each arrival 10 times, jittered within `jitter_s`; `amplify(trace, 0.5)` keeps each with
probability 0.5 (both seeded).
`time_scale(trace, 60)` compresses time: one hour in one minute, 60 x the rate.

Synthetic traces (seeded), the same CSV: `diurnal` (a sine day with bursts: the peak minute is
~10 x the mean minute), `bursty` (flat load with one-minute bursts, also ~10 x), `steps` (step ramps up and
down), `ramp` (10 QPS, then 10 -> 10,000 QPS linearly in 60 s, then hold) and `daily` (real
days, each with the same 10-minute 15 x peak at 09:00, which a forecast can learn):

    python -m capacity.simulate.traces --kind diurnal --seed 1 --out /tmp/diurnal.csv
"""

from __future__ import annotations

import argparse
import bisect
import csv
import math
import random
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from capacity.simulate.arrivals import MAX_TOKENS, Arrival, Trace, from_rate

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
EPOCH = datetime(2024, 1, 1)  # synthetic traces start here

__all__ = [
    "COLUMNS",
    "KINDS",
    "Arrival",
    "Trace",
    "TraceError",
    "amplify",
    "bursty",
    "daily",
    "diurnal",
    "from_rate",
    "load",
    "per_minute_counts",
    "ramp",
    "save",
    "steps",
    "time_scale",
]


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and the line."""


def parse_timestamp(text: str) -> datetime:
    """'2023-11-16 18:15:46.6805900' (7 fractional digits, as in the Azure trace) -> datetime."""
    text = text.strip()
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{(frac + '000000')[:6]}"
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f")
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S")


def load(path: str) -> Trace:
    """Read a trace CSV; a bad header or row raises TraceError naming the line."""
    rows: list[tuple[datetime, int, int]] = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header[:3]) != COLUMNS:
            raise TraceError(f"{path}:1: expected the header {','.join(COLUMNS)}, got {header!r}")
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                when = parse_timestamp(row[0])
                prompt, output = int(row[1]), int(row[2])
            except (ValueError, IndexError) as e:
                raise TraceError(f"{path}:{line}: bad row {row!r}: {e}") from None
            if not (0 <= prompt <= MAX_TOKENS and 0 <= output <= MAX_TOKENS):
                raise TraceError(f"{path}:{line}: token count out of range [0, {MAX_TOKENS}] in {row!r}")
            rows.append((when, max(prompt, 1), max(output, 1)))
    if not rows:
        raise TraceError(f"{path}: no arrivals")
    start = min(r[0] for r in rows)
    rows.sort(key=lambda r: r[0])
    return Trace(Arrival((when - start).total_seconds(), p, o) for when, p, o in rows)


def save(trace: Sequence[Arrival], path: str) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for a in trace:
            when = EPOCH + timedelta(seconds=a.time_s)
            writer.writerow([when.strftime("%Y-%m-%d %H:%M:%S.%f") + "0", a.prompt_tokens, a.output_tokens])


def amplify(trace: Sequence[Arrival], factor: float, seed: int = 0, jitter_s: float = 1.0) -> Trace:
    """Each arrival floor(factor) times, plus once more with probability frac(factor); copies
    after the first are moved by up to `jitter_s` (uniform), so 10 x 5 QPS is 50 QPS, not 5
    bursts of 10. factor 2.5 -> 2 or 3 copies; 0.3 -> kept with probability 0.3."""
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"amplify factor={factor!r} must be a finite number > 0")
    rng = random.Random(seed)
    whole, frac = int(factor), factor - int(factor)
    out: list[Arrival] = []
    for a in trace:
        copies = whole + (1 if rng.random() < frac else 0)
        for k in range(copies):
            shift = 0.0 if k == 0 else rng.uniform(0.0, jitter_s)
            out.append(Arrival(a.time_s + shift, a.prompt_tokens, a.output_tokens))
    out.sort(key=lambda a: a.time_s)
    return Trace(out)


def time_scale(trace: Sequence[Arrival], factor: float) -> Trace:
    """Compress time by `factor`: 60 plays an hour in a minute (and 60 x the rate)."""
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"time-scale factor={factor!r} must be a finite number > 0")
    return Trace(Arrival(a.time_s / factor, a.prompt_tokens, a.output_tokens) for a in trace)


# --- synthetic traces ---------------------------------------------------------------------------


def _minute_starts(rng: random.Random, seconds: float, count: int) -> list[float]:
    """`count` distinct whole minutes in the middle 80 % of the run, where bursts start."""
    minutes = list(range(max(1, int(seconds * 0.1 / 60)), max(2, int(seconds * 0.9 / 60))))
    return sorted(60.0 * m for m in rng.sample(minutes, min(count, len(minutes))))


def _in_burst(starts: list[float], t: float) -> bool:
    """Whether t falls in the minute after one of the sorted `starts`."""
    at = bisect.bisect_right(starts, t)
    return at > 0 and t < starts[at - 1] + 60.0


def diurnal(seed: int, seconds: float = 3600.0, base_qps: float = 20.0, bursts: int = 2) -> Trace:
    """A day squeezed into `seconds` (sine around `base_qps`: trough 0.2 x, crest 1.8 x) with
    `bursts` one-minute bursts at 15 x base, aligned to minutes. Worked numbers, an hour: the
    mean minute is base x (1 + 2 x 14 / 60) = 1.47 x base; the burst minutes 15 x base: per
    minute, peak / mean = 15 / 1.47 = 10.2."""
    starts = _minute_starts(random.Random(seed), seconds, bursts)

    def rate(t: float) -> float:
        if _in_burst(starts, t):
            return 15.0 * base_qps
        return base_qps * (1.0 - 0.8 * math.cos(2 * math.pi * t / seconds))

    return from_rate(rate, seconds, seed)


def bursty(seed: int, seconds: float = 3600.0, base_qps: float = 20.0, bursts: int = 3) -> Trace:
    """Flat `base_qps` with `bursts` one-minute bursts at 20 x base: per minute, peak / mean =
    20 / (1 + 3 x 19 / 60) = 10.3 over an hour."""
    starts = _minute_starts(random.Random(seed), seconds, bursts)

    def rate(t: float) -> float:
        return 20.0 * base_qps if _in_burst(starts, t) else base_qps

    return from_rate(rate, seconds, seed)


def steps(seed: int, seconds: float = 3600.0, low_qps: float = 10.0, high_qps: float = 200.0) -> Trace:
    """Step ramps: low, then up in four equal steps to high, then down again (eighths of the run)."""
    levels = [low_qps + (high_qps - low_qps) * k / 4 for k in (0, 1, 2, 3, 4, 3, 2, 0)]

    def rate(t: float) -> float:
        return levels[min(int(t / seconds * len(levels)), len(levels) - 1)]

    return from_rate(rate, seconds, seed)


def ramp(
    seed: int,
    before_s: float = 300.0,
    ramp_s: float = 60.0,
    hold_s: float = 300.0,
    low_qps: float = 10.0,
    high_qps: float = 10_000.0,
) -> Trace:
    """`low_qps` for `before_s`, linearly to `high_qps` over `ramp_s`, then `hold_s` at the top."""

    def rate(t: float) -> float:
        if t < before_s:
            return low_qps
        if t < before_s + ramp_s:
            return low_qps + (high_qps - low_qps) * (t - before_s) / ramp_s
        return high_qps

    return from_rate(rate, before_s + ramp_s + hold_s, seed)


def daily(
    seed: int,
    days: int = 3,
    base_qps: float = 2.0,
    peak_qps: float = 30.0,
    peak_at_s: float = 9 * 3600.0,
    peak_s: float = 600.0,
) -> Trace:
    """`days` real days of flat `base_qps`, each with a step to `peak_qps` at `peak_at_s` after
    midnight for `peak_s`: a recurring peak, faster than a pod start, at the same time every day."""

    def rate(t: float) -> float:
        return peak_qps if peak_at_s <= t % 86400.0 < peak_at_s + peak_s else base_qps

    return from_rate(rate, days * 86400.0, seed)


KINDS: dict[str, Callable[[int], Trace]] = {
    "diurnal": diurnal,
    "bursty": bursty,
    "steps": steps,
    "ramp": ramp,
    "daily": daily,
}


def per_minute_counts(trace: Sequence[Arrival]) -> list[int]:
    if not trace:
        return []
    counts = [0] * (int(trace[-1].time_s // 60) + 1)
    for a in trace:
        counts[int(a.time_s // 60)] += 1
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m capacity.simulate.traces", description=__doc__)
    parser.add_argument("--kind", choices=sorted(KINDS), required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="CSV path to write")
    parser.add_argument("--minutes", type=float, default=0, help="keep only the first N minutes")
    args = parser.parse_args(argv)
    trace = KINDS[args.kind](args.seed)
    if args.minutes > 0:
        trace = trace[: bisect.bisect_left(trace.times, args.minutes * 60)]
    save(trace, args.out)
    counts = per_minute_counts(trace)
    mean = sum(counts) / len(counts)
    print(f"{len(trace)} arrivals over {len(counts)} min; per-minute peak/mean {max(counts) / mean:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
