"""A series of bursts: when an endpoint's bursts recur, what serving the next from standing
capacity needs, and the series carried from pass to pass as state. Pure. Within the burst
memory (`burst_memory_s`) the horizontal decider holds a recurring series' tallest need
(`recurring`). A series that has gone on for as long as the memory or longer (from its first
burst's start to its last one's end), which the memory alone no longer sees whole, and is one
level (its tallest burst needs at most `ONE_LEVEL` x its median) is carried past it (`Series`,
kept by the caller as it keeps `calm.quiet_since`): its tallest need holds until a memory passes
without a burst, so a gap longer than the memory does not shed the fleet its next burst needs.
A cluster of bursts that happened within one memory is not carried, nor a series of mixed
heights (a few tall bursts among lumps), whose tallest would hold a fleet for its rare bursts.
Each rule and why, with figures: docs/autoscaler.md, "The horizontal decider".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import NamedTuple

from capacity.autoscaler.config import AutoscalerConfig
from capacity.autoscaler.window import Bucket, Buckets, Timeline

# A series of bursts is over once this many times its mean gap has passed since its last burst:
# were the gaps memoryless (exponential), one that long would come once in e^8 ~ 3,000 (at 4,
# once in ~55: bursts 10-30 s apart let their fleet go 40-120 s after the last). Series whose
# gaps are 40 s or more end sooner, when fewer than SERIES_RUNS of them are within the memory.
RECURRENCE_SILENCE = 8.0
# Runs of buckets within the memory that make a series: two gaps, not a chance pair of bursts.
SERIES_RUNS = 3
# A series is carried only while its tallest burst needs at most this many times its median
# burst: one level. Any spread from 1.5 to 3 carries the same series in the measured families
# and traces.
ONE_LEVEL = 2.0
# The bursts a carried series keeps, the newest: its level and median are over these.
KEPT_RUNS = 32


class Run(NamedTuple):
    """A burst: buckets above the memory's base from `start` to `end` (seconds), and the MU/min
    that serves its work from standing capacity within its length plus `burst_wait_s`. A named
    tuple, not a dataclass: a pass reads up to KEPT_RUNS of them per bursting endpoint."""

    start: float
    end: float
    need: float


def series_runs(buckets: Buckets, now: float, cfg: AutoscalerConfig) -> tuple[Run, ...]:
    """The bursts within `burst_memory_s`, oldest first: runs of buckets above `burst_ratio` x
    the memory's base, each `peak_window_s` long at least (a shorter one is a lump of a sparse
    endpoint's noise). The base is the quietest quarter's top (the bucket at the 25th percentile
    of MU/min), which bursts filling most of the memory do not lift; a dip shorter than
    `peak_window_s` does not end a run (a noisy bucket within one burst is no gap). A run needs
    its work served within its length plus `burst_wait_s` (burst_hold's rule, over the whole
    run). None (empty) when off. Found once per timeline, now and rule (`Timeline.found`): the
    pass asks twice, for the series it carries and for the decision."""
    memory = cfg.burst_memory_s
    if cfg.burst_recurrence_s <= 0 or memory <= 0:
        return ()
    timeline = Timeline.of(buckets)
    key = ("series_runs", now, memory, cfg.burst_ratio, cfg.peak_window_s, cfg.burst_wait_s)
    found = timeline.found.get(key)
    if found is None:
        found = timeline.found[key] = _runs(timeline.between(now - memory, now), cfg)
    return found


def _runs(inside: list[Bucket], cfg: AutoscalerConfig) -> tuple[Run, ...]:
    if len(inside) < 4:
        return ()
    rates = sorted([b.mu_per_minute for b in inside])
    base = rates[len(rates) // 4]
    above = cfg.burst_ratio * base
    if base <= 0 or rates[-1] <= above:  # no base, or no run: most endpoints, before the loop
        return ()
    # Gaps, lengths and the silence are times, not the seconds the buckets cover: a slot no
    # router reported is no bucket, and must not shorten a gap nor keep a series going.
    runs: list[tuple[float, float, float]] = []  # (start, end, work) of each run
    start = work = dipped = 0.0  # dipped: the work since the run's last bucket above
    end: float | None = None  # the current run's last bucket above ends here
    for b in inside:
        if b.mu_per_minute <= above:
            dipped += b.mu_per_minute * b.seconds / 60.0
            continue
        begins = b.end - b.seconds
        if end is None or begins - end >= cfg.peak_window_s:  # a run starts
            if end is not None:
                runs.append((start, end, work))
            start, work = begins, 0.0
        else:  # a dip within the run: its time and work are the run's
            work += dipped
        work += b.mu_per_minute * b.seconds / 60.0
        end, dipped = b.end, 0.0
    if end is not None:
        runs.append((start, end, work))
    wait, shortest = cfg.burst_wait_s, cfg.peak_window_s
    return tuple(Run(s, e, w * 60.0 / (e - s + wait)) for s, e, w in runs if e - s >= shortest)


def recurs(runs: Sequence[Run], now: float, cfg: AutoscalerConfig) -> bool:
    """True when the runs within the memory are a series: SERIES_RUNS or more, less than
    `burst_recurrence_s` apart on average (from one's end to the next's start), the last ended
    less than RECURRENCE_SILENCE x that mean ago."""
    if len(runs) < SERIES_RUNS:
        return False
    between = sum(r.end - r.start for r in runs[1:-1])
    mean_gap = (runs[-1].start - runs[0].end - between) / (len(runs) - 1)
    return mean_gap < cfg.burst_recurrence_s and now - runs[-1].end < RECURRENCE_SILENCE * mean_gap


def recurring(buckets: Buckets, now: float, cfg: AutoscalerConfig) -> float:
    """MU/min that a series of bursts within `burst_memory_s` needs standing (`series_runs`,
    `recurs`), 0 when they do not recur: the most of its runs' needs. Its next burst may come
    before new pods are ready, served by what stands, and may be its tallest again (one tall
    burst among lower ones is held past the cap until it leaves the memory).

    Worked numbers (ratio 2.5, wait 5 s, 5-s buckets, memory 300 s): 400 MU/min with 20-s bursts
    at 2,800 every 50 s: base 400, six runs with 30 s between, each 933 MU over 20 s: 933 x 60 /
    25 = 2,240 MU/min, until 190 s after the last, when the memory holds two of them (eight times
    the 30-s gaps would be 240 s); one burst among them at 3x: its 6,720. The same bursts 4
    minutes apart: two runs at most: 0. Steady 400, or 0 at the base: 0.
    """
    runs = series_runs(buckets, now, cfg)
    return max(r.need for r in runs) if recurs(runs, now, cfg) else 0.0


@dataclass(frozen=True)
class Series:
    """A series of bursts seen since it began (the newest KEPT_RUNS, oldest first), carried from
    pass to pass (`carried`)."""

    runs: tuple[Run, ...]

    def level(self, now: float, cfg: AutoscalerConfig) -> float:
        """MU/min the series holds standing past the memory: its tallest burst's need, once it has
        gone on for `burst_memory_s`, while that is at most ONE_LEVEL x its median burst's, until
        `burst_memory_s` pass after its last; else 0.

        Worked numbers (memory 300 s): seven bursts 50 s apart needing 900-1,200 MU/min, the
        first starting at t - 320 and the last ending at t: 1,200 until t + 300. One of them
        needing 2,800 instead: 2,800 > 2 x 1,100: 0. The first five only (220 s): 0."""
        runs, memory = self.runs, cfg.burst_memory_s
        if not runs or runs[-1].end - runs[0].start < memory or now - runs[-1].end >= memory:
            return 0.0
        needs = sorted(r.need for r in runs)
        return needs[-1] if needs[-1] <= ONE_LEVEL * needs[len(needs) // 2] else 0.0

    def joined(self, runs: Sequence[Run], cfg: AutoscalerConfig) -> Series:
        """With the runs seen in this pass: a run seen again (longer now, or judged on a moved
        base, or cut at the memory's start) overlaps a kept one, less than `peak_window_s` apart,
        as within a pass: one burst, the longest extent and the highest need seen."""
        joined: list[Run] = []
        for run in sorted((*self.runs, *runs), key=lambda r: r.start):
            if joined and run.start - (last := joined[-1]).end < cfg.peak_window_s:
                joined[-1] = Run(last.start, max(last.end, run.end), max(last.need, run.need))
            else:
                joined.append(run)
        return Series(tuple(joined[-KEPT_RUNS:]))

    def rows(self) -> list[list[float]]:
        """As stored (JSON): one [start, end, need] a burst."""
        return [[r.start, r.end, r.need] for r in self.runs]

    @classmethod
    def of_rows(cls, rows: Sequence[Sequence[float]]) -> Series:
        """As `rows` wrote it; ValueError or TypeError for anything else (no run, or one that
        is not three finite numbers, start <= end, in order)."""
        runs = tuple(map(Run._make, rows))  # TypeError unless three of each
        figures = list(chain.from_iterable(runs))
        ends = [x for r in runs for x in (r.start, r.end)]
        if not runs or not set(map(type, figures)) <= {int, float} or ends != sorted(ends):
            raise ValueError(f"not a series of bursts: {rows!r}")  # no bool, str, list
        try:
            if all(map(math.isfinite, figures)):
                return cls(runs)
        except OverflowError:  # an integer beyond any float
            pass
        raise ValueError(f"not a series of bursts: {rows!r}")


def carried(previous: Series | None, buckets: Buckets, now: float, cfg: AutoscalerConfig) -> Series | None:
    """The series after this pass: one begins when the runs within the memory recur, takes in
    every run seen while it recurs or holds a level (`Series.level`), and ends (None) when it
    does neither, or when the series rule is turned off."""
    if cfg.burst_recurrence_s <= 0 or cfg.burst_memory_s <= cfg.scale_down_window_s:
        return None  # the series rule, or the hold's memory, is off
    if previous is not None and previous.runs[-1].end > now:
        previous = None  # kept by a clock ahead of this one: what it saw may never have happened
    runs = series_runs(buckets, now, cfg)
    live = recurs(runs, now, cfg)
    if previous is None:
        return Series(runs[-KEPT_RUNS:]) if live else None
    series = previous.joined(runs, cfg) if runs else previous
    return series if live or series.level(now, cfg) > 0 else None


def held(series: Series | None, now: float, cfg: AutoscalerConfig) -> float:
    """MU/min a carried series (None: none) holds past the memory: the decider's `series_level`."""
    return 0.0 if series is None else series.level(now, cfg)
