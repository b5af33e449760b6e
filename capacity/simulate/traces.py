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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from capacity.simulate.arrivals import MAX_TOKENS, Arrival, LogNormalShape, Trace, as_trace, from_rate

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
EPOCH = datetime(2024, 1, 1)  # synthetic traces start here

__all__ = [
    "BURST_WINDOW",
    "COLUMNS",
    "FAMILY_RANGES",
    "KINDS",
    "Arrival",
    "BurstFamily",
    "Trace",
    "TraceError",
    "amplify",
    "burst_stats",
    "bursty",
    "daily",
    "decode_heavy",
    "diurnal",
    "family_grid",
    "from_rate",
    "load",
    "long_context",
    "per_minute_counts",
    "prefill_heavy",
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
    """Read a trace CSV (UTF-8, with or without the byte-order mark a spreadsheet writes); a bad
    header, row or byte raises TraceError naming the line."""
    with open(path, "rb") as f:
        return _read(path, csv.reader(_text_lines(path, f)))


def _text_lines(path: str, lines: Iterator[bytes]) -> Iterator[str]:
    """The file's lines as text, decoded one at a time so that a bad byte is named by its line."""
    for number, raw in enumerate(lines, start=1):
        try:
            yield raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise TraceError(
                f"{path}:{number}: not UTF-8 text ({e.reason} at byte {e.start} of the line)"
            ) from None


def _read(path: str, reader: Iterator[list[str]]) -> Trace:
    rows: list[tuple[datetime, int, int]] = []
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header[:3]) != COLUMNS:
        raise TraceError(f"{path}:1: expected the header {','.join(COLUMNS)}, got {header!r}")
    for line, row in enumerate(reader, start=2):
        if not row:
            continue
        if len(row) < len(COLUMNS):
            raise TraceError(
                f"{path}:{line}: expected {len(COLUMNS)} columns ({','.join(COLUMNS)}), got {row!r}"
            )
        try:
            when = parse_timestamp(row[0])
            prompt, output = int(row[1]), int(row[2])
        except ValueError as e:
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


def surge(trace: Sequence[Arrival], factor: float, start_s: float, seconds: float, seed: int = 0) -> Trace:
    """`trace` with its arrivals in [start_s, start_s + seconds) `factor` times over (> 1): each
    copied floor(factor - 1) times, plus once more with probability frac(factor - 1), within a
    second of it, as `amplify` copies. A steady endpoint's surge (a batch job, a client's retry
    storm): 1.5 for 60 s at 12:17 adds half of every arrival from 12:17 to 12:18."""
    if not (factor > 1 and math.isfinite(factor)):
        raise ValueError(f"surge factor={factor!r} must be a finite number > 1")
    if not (seconds > 0 and math.isfinite(seconds) and math.isfinite(start_s)):
        raise ValueError(f"surge of {seconds!r} s from {start_s!r} s: both must be finite, the length > 0")
    rng = random.Random(seed)
    extra = factor - 1.0
    whole, frac = int(extra), extra - int(extra)
    out = list(trace)
    for a in trace:
        if start_s <= a.time_s < start_s + seconds:
            copies = whole + (1 if rng.random() < frac else 0)
            out += [
                Arrival(a.time_s + rng.uniform(0.0, 1.0), a.prompt_tokens, a.output_tokens)
                for _ in range(copies)
            ]
    out.sort(key=lambda a: a.time_s)
    return Trace(out)


# --- synthetic traces ---------------------------------------------------------------------------


# Where the generators' bursts may start, as shares of the run: the middle 80 %. What a policy
# cannot foresee is priced over it (`scenario.causal_floor`).
BURST_WINDOW = (0.1, 0.9)


def _minute_starts(rng: random.Random, seconds: float, count: int) -> list[float]:
    """`count` distinct whole minutes in the middle 80 % of the run, where bursts start."""
    first, last = BURST_WINDOW
    minutes = list(range(max(1, int(seconds * first / 60)), max(2, int(seconds * last / 60))))
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


# --- production-like mixes: shapes from a median and a quantile, bursts at 10 s ----------------------------

# Prefill-heavy (RAG, code assistants): long prompts, short answers, as in a public trace of
# this kind: prompts median ~1,470 (p90 ~5,200), outputs median 13 (p90 55).
PREFILL_HEAVY = LogNormalShape(1470, 0.9, 5200, 13, 0.9, 55, max_prompt=8000, max_output=1000)
# Long contexts (documents, long chats): prompts median ~6,900, p99 ~85,000; outputs median 350.
LONG_CONTEXT = LogNormalShape(6900, 0.99, 85_000, 350, 0.9, 900, max_prompt=126_000, max_output=4000)
# Decode-heavy (chat, agents): moderate prompts, long answers.
DECODE_HEAVY = LogNormalShape(600, 0.9, 2400, 400, 0.9, 1200, max_prompt=8000, max_output=4000)


def _burst_spans(
    rng: random.Random, seconds: float, count: int, lengths: Sequence[float]
) -> list[tuple[float, float]]:
    """`count` bursts starting at whole 10 s in the middle 80 % of the run, each lasting one of
    `lengths` seconds (several may fall in one minute, as real bursts cluster)."""
    first, last = BURST_WINDOW
    slots = list(range(max(1, int(seconds * first / 10)), max(2, int(seconds * last / 10))))
    starts = sorted(10.0 * s for s in rng.sample(slots, min(count, len(slots))))
    return [(t, t + rng.choice(list(lengths))) for t in starts]


def _rate_with_bursts(
    base: Callable[[float], float], spans: list[tuple[float, float]], burst_qps: float
) -> Callable[[float], float]:
    begins = [a for a, _ in spans]

    def rate(t: float) -> float:
        at = bisect.bisect_right(begins, t)
        if at > 0 and t < spans[at - 1][1]:
            return burst_qps
        return base(t)

    return rate


def prefill_heavy(seed: int, seconds: float = 1800.0, base_qps: float = 30.0, bursts: int = 5) -> Trace:
    """Prefill-heavy, bursty: `base_qps` with a +-30 % wobble of ~7 minutes, and `bursts`
    bursts of 10-20 s at 20 x base (per 10 s, peak / mean ~12; per minute ~3-4). Worked numbers,
    40 QPS: the mean request is ~2,700 prompt tokens, 0.11 s of an H100's prefill, so a burst of
    520 QPS asks ~57 replicas' prefill where the base asks ~5."""
    rng = random.Random(seed)
    spans = _burst_spans(rng, seconds, bursts, (10.0, 10.0, 20.0))
    phase = rng.uniform(0, 2 * math.pi)

    def base(t: float) -> float:
        return base_qps * (1.0 + 0.3 * math.sin(2 * math.pi * t / 420.0 + phase))

    return from_rate(_rate_with_bursts(base, spans, 20.0 * base_qps), seconds, seed, PREFILL_HEAVY)


# The ranges a prefill-heavy bursty family is drawn from (family_grid): a burst's length (s),
# its height (x the base rate), the mean quiet gap between bursts (s), the prompt median and the
# answer median (tokens).
FAMILY_RANGES = {
    "burst_s": (10.0, 60.0),
    "height": (2.0, 20.0),
    "gap_s": (10.0, 3600.0),
    "prompt_median": (1000.0, 8000.0),
    "output_median": (5.0, 50.0),
}
# The base load's prompt tokens per second, whatever the prompts: ~2.5 H100 replicas' prefill
# (h100-llama-8b), so a family's fleet is sized by its bursts' height, not by its prompt median.
BASE_PROMPT_TOKENS_PER_S = 40_000.0


@dataclass(frozen=True)
class BurstFamily:
    """Prefill-heavy bursty traffic from parameters (RAG, code assistants): a base rate with a
    +-20 % wobble of ~7 minutes carrying BASE_PROMPT_TOKENS_PER_S, and bursts of `burst_s`
    at `height` x the base, the quiet gaps between them exponential around `gap_s` (the first
    burst within the first gap, or the run, after its first 10 %; none past 90 %); prompts
    log-normal with median `prompt_median` and p90 3.5 x it, answers median `output_median` and
    p90 4 x it. Worked numbers, prompts of median 2,000: mean ~3,200 tokens, base ~12.5 QPS, a
    burst of height 10 ~125 QPS."""

    burst_s: float
    height: float
    gap_s: float
    prompt_median: float
    output_median: float

    @property
    def name(self) -> str:
        return (
            f"b{self.burst_s:.0f}-h{self.height:.0f}-g{self.gap_s:.0f}"
            f"-p{self.prompt_median / 1000:.1f}k-o{self.output_median:.0f}"
        )

    @property
    def shape(self) -> LogNormalShape:
        prompt, output = self.prompt_median, self.output_median
        return LogNormalShape(
            prompt,
            0.9,
            3.5 * prompt,
            output,
            0.9,
            4.0 * output,
            max_prompt=int(16 * prompt),
            max_output=int(40 * output),
        )

    @property
    def base_qps(self) -> float:
        sigma = self.shape.sigma_prompt
        mean_prompt = self.prompt_median * math.exp(sigma * sigma / 2)  # a log-normal's mean
        return BASE_PROMPT_TOKENS_PER_S / mean_prompt

    def spans(self, seed: int, seconds: float) -> list[tuple[float, float]]:
        """The bursts' (start, end), seconds."""
        rng = random.Random(seed)
        first, last = (seconds * f for f in BURST_WINDOW)
        start = first + rng.uniform(0.0, max(0.0, min(self.gap_s, last - first - self.burst_s)))
        out = []
        while start + self.burst_s <= last:
            out.append((start, start + self.burst_s))
            start += self.burst_s + rng.expovariate(1.0 / self.gap_s)
        return out

    def trace(self, seed: int, seconds: float = 1800.0) -> Trace:
        base_qps = self.base_qps
        phase = random.Random(seed).uniform(0, 2 * math.pi)

        def base(t: float) -> float:
            return base_qps * (1.0 + 0.2 * math.sin(2 * math.pi * t / 420.0 + phase))

        spans = self.spans(seed, seconds)
        return from_rate(_rate_with_bursts(base, spans, self.height * base_qps), seconds, seed, self.shape)


def family_grid(count: int, seed: int = 0) -> list[BurstFamily]:
    """`count` families spread over FAMILY_RANGES (a Latin hypercube, each range cut into `count`
    strata, log-uniform within: every stratum of every parameter is taken once), seeded."""
    rng = random.Random(seed)
    columns = {}
    for name, (low, high) in FAMILY_RANGES.items():
        strata = list(range(count))
        rng.shuffle(strata)
        columns[name] = [low * (high / low) ** ((k + rng.random()) / count) for k in strata]
    return [BurstFamily(**{name: values[i] for name, values in columns.items()}) for i in range(count)]


def long_context(seed: int, seconds: float = 1800.0, base_qps: float = 6.0) -> Trace:
    """Long contexts, smooth: `base_qps` +-15 % over the run. Worked numbers: the mean prompt is
    ~12,000 tokens (0.5 s of H100 prefill) and holds ~12,500 tokens of KV for its answer's ~8 s,
    so KV, not slots, bounds a replica's batch: 400k tokens / 12.5k = 32."""
    phase = random.Random(seed).uniform(0, 2 * math.pi)

    def rate(t: float) -> float:
        return base_qps * (1.0 + 0.15 * math.sin(2 * math.pi * t / seconds + phase))

    return from_rate(rate, seconds, seed, LONG_CONTEXT)


def decode_heavy(seed: int, seconds: float = 1800.0, base_qps: float = 30.0, bursts: int = 6) -> Trace:
    """Decode-heavy (chat, agents): long answers, `base_qps` with a +-20 % wobble and `bursts`
    10-30 s agent fan-outs at 4 x base."""
    rng = random.Random(seed)
    spans = _burst_spans(rng, seconds, bursts, (10.0, 20.0, 30.0))
    phase = rng.uniform(0, 2 * math.pi)

    def base(t: float) -> float:
        return base_qps * (1.0 + 0.2 * math.sin(2 * math.pi * t / 600.0 + phase))

    return from_rate(_rate_with_bursts(base, spans, 4.0 * base_qps), seconds, seed, DECODE_HEAVY)


def burst_stats(trace: Sequence[Arrival]) -> dict[str, float]:
    """Per-minute and per-10 s peak / mean of arrivals, and the prompt and output quantiles that
    name a mix (what the issue gives for the traces it was not tuned on)."""
    out: dict[str, float] = {}
    if not trace:
        return out
    columns = as_trace(trace)
    for label, width in (("minute", 60.0), ("10s", 10.0)):
        counts = [0] * (int(columns.times[-1] // width) + 1)
        for t in columns.times:
            counts[int(t // width)] += 1
        out[f"peak_mean_{label}"] = max(counts) / (sum(counts) / len(counts))
    for name, column in (("prompt", columns.prompts), ("output", columns.outputs)):
        ordered = sorted(column)
        for q in (0.5, 0.9, 0.99):
            out[f"{name}_p{round(q * 100)}"] = float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])
    return out


KINDS: dict[str, Callable[[int], Trace]] = {
    "diurnal": diurnal,
    "bursty": bursty,
    "steps": steps,
    "ramp": ramp,
    "daily": daily,
    "prefill-heavy": prefill_heavy,
    "long-context": long_context,
    "decode-heavy": decode_heavy,
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
    parser.add_argument("--kind", choices=sorted(KINDS), required=True, help="the family of traffic to make")
    parser.add_argument("--seed", type=int, default=0, help="one trace of the family per seed")
    parser.add_argument("--out", required=True, help="CSV path to write")
    parser.add_argument("--minutes", type=float, default=0, help="keep only the first N minutes")
    args = parser.parse_args(argv)
    trace = KINDS[args.kind](args.seed)
    if args.minutes > 0:
        trace = trace[: bisect.bisect_left(trace.times, args.minutes * 60)]
    save(trace, args.out)
    counts = per_minute_counts(trace)
    stats = burst_stats(trace)
    print(
        f"{len(trace)} arrivals over {len(counts)} min; peak/mean per minute"
        f" {stats['peak_mean_minute']:.1f}, per 10 s {stats['peak_mean_10s']:.1f}; prompts p50/p90/p99"
        f" {stats['prompt_p50']:.0f}/{stats['prompt_p90']:.0f}/{stats['prompt_p99']:.0f},"
        f" outputs {stats['output_p50']:.0f}/{stats['output_p90']:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
