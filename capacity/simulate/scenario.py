"""One simulation from names: a profile, a trace, a policy; the oracle and static peak sized from
the trace. Pure. The CLI and the bench both go through `simulate`.

With `oracle_search`, the oracle's schedule is searched with the simulator itself, not only
computed from the busiest 10 s of each minute (`search_schedule`): a greedy repair, then trims
down to one replica at a time: a schedule that meets every minute it can, close to the fewest
replicas, not a proof of the fewest. Minutes it still misses with the fleet's ceiling (or after
its rounds) are `unmet`: the bench leaves them out of every policy's score and shows them apart.
`minute_bounds` bounds it from below: the fewest replicas each minute needs played alone;
`causal_floor` bounds what a policy that sees a burst only when it comes takes to meet every minute."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from capacity.autoscaler import AutoscalerConfig
from capacity.autoscaler.calm import CALM_BASE_S, CALM_SPAN_S
from capacity.simulate.arrivals import Arrival, Trace, as_trace
from capacity.simulate.fleet import FleetConfig, Result, Second, run
from capacity.simulate.policies import Apa, DecisionLog, Hpa, Kpa, ScalingPolicy, Schedule
from capacity.simulate.sizing import (
    full_batch,
    oracle_schedule,
    slo_capacity_mu_per_s,
)
from capacity.simulate.traces import BURST_WINDOW
from capacity.units import MU_PER_REPLICA_MINUTE
from engine_model.perf_model import EngineProfile

POLICIES = ("apa", "hpa", "kpa", "oracle", "static-peak")
# Kubernetes Services and Knative (default containerConcurrency 0) put no limit on a pod's
# concurrency: under hpa and kpa the router still balances, but every request goes to a pod and
# queues in its engine, where their in-flight metric sees it. apa and the schedules run with the
# router's per-replica limit (the engine's full batch, or the vertical decider's target).
UNLIMITED = ("hpa", "kpa")
NO_LIMIT = 1_000_000


def make_policy(
    name: str,
    schedule: Sequence[int],
    fleet: FleetConfig,
    apa_config: AutoscalerConfig,
    warmup_s: float = 0.0,
    mu_per_replica_minute: float = MU_PER_REPLICA_MINUTE,
    peer_target: float | None = None,
) -> ScalingPolicy:
    """The policy `name`; `peer_target`: hpa's or kpa's target in-flight requests per pod, in
    place of its default (70 for both)."""
    if name == "apa":
        return Apa(mu_per_replica_minute, scale_to_zero=fleet.min_replicas == 0, config=apa_config)
    if name == "hpa":
        return Hpa() if peer_target is None else Hpa(target_per_pod=peer_target)
    if name == "kpa":
        return Kpa() if peer_target is None else Kpa(target_per_pod=peer_target)
    if name == "oracle":
        return Schedule(
            per_minute=tuple(schedule), lead_s=fleet.pod_start_s, offset_s=warmup_s, name="oracle"
        )
    if name == "static-peak":
        peak = max(schedule, default=1)
        return Schedule(per_minute=(peak,), lead_s=0.0, name="static-peak")
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")


@dataclass(frozen=True)
class SearchedSchedule:
    per_minute: tuple[int, ...]  # replicas each measured minute, from minute 0
    unmet: tuple[int, ...]  # minutes the search could not meet (excluded from scores)
    runs: int  # simulations it took
    result: Result  # the oracle's run on the final schedule


# The trims after the repair: (p99 ratio under which a minute is slack, share of its replicas it
# gives up, at least one). Two coarse ones first, then one replica at a time down to any slack.
TRIMS = ((0.6, 0.15), (0.6, 0.15), (0.8, 0.10), (0.9, 0.05), *[(0.95, 0.0)] * 2, *[(1.0, 0.0)] * 3)
# The one-replica trims stop once one takes off less than this share of the GPU-hours: on a fleet
# of thousands (the 10,000 QPS ramp) each is a replay of minutes of CPU for almost nothing.
TRIM_ENOUGH = 0.005


def search_schedule(
    start: Sequence[int], replay: Callable[[Sequence[int]], Result], ceiling: int, rounds: int = 5
) -> SearchedSchedule:
    """From `start`, repair then trim a per-minute schedule by replaying it (`replay`).

    Repair: every missed minute gets 30 % more replicas, plus one, up to `ceiling`, until none
    is missed or `rounds` pass. Trim (`TRIMS`, in turn): every minute whose p99 of latency /
    deadline is under a threshold gives up a share of its replicas (at least one); a minute that
    then misses (and its neighbours, whose tails and pod starts it shares) gets its replicas back,
    up to four times, and a trim that still breaks a minute is undone. Worked numbers: [6, 40, 6]
    missing minute 1 -> [6, 53, 6]; a trim of a minute at p99 0.3 of its deadline with 20
    replicas tries 17. The last trims take one replica from every minute with any slack at once,
    until one takes off under `TRIM_ENOUGH`: closer to the fewest than the coarse ones, still not
    a proof (docs/autoscaler.md, for what they took off on the bench's traces)."""
    schedule = [min(max(n, 1), ceiling) for n in start]
    result = replay(schedule)
    runs = 1
    for _ in range(rounds):
        missed = [m for m in result.violating_minutes if m < len(schedule) and schedule[m] < ceiling]
        if not missed:
            break
        for m in missed:
            schedule[m] = min(ceiling, math.ceil(schedule[m] * 1.3) + 1)
        result, runs = replay(schedule), runs + 1
    tried: set[tuple[int, ...]] = set()  # a trial is replayed once: the same trial fails the same
    for slack_below, share in TRIMS:
        slack = {
            m.minute for m in result.minutes if m.p99_slo_ratio < slack_below and m.minute < len(schedule)
        }
        trial = [
            max(1, min(n - 1, math.floor(n * (1 - share)))) if m in slack else n
            for m, n in enumerate(schedule)
        ]
        if trial == schedule or tuple(trial) in tried:
            continue
        tried.add(tuple(trial))
        before = set(result.violating_minutes)
        checked, runs = replay(trial), runs + 1
        for _ in range(4):
            broken = set(checked.violating_minutes) - before
            trimmed = list(trial)
            for m in broken:
                for j in (m - 1, m, m + 1):
                    if 0 <= j < len(trial):
                        trial[j] = schedule[j]
            if not broken or trial in (trimmed, schedule):
                break  # kept, or nothing more to give back: a minute broken from afar undoes it
            checked, runs = replay(trial), runs + 1
        if (
            trial != schedule
            and set(checked.violating_minutes) <= before
            and checked.gpu_hours <= result.gpu_hours
        ):
            saved = 1 - checked.gpu_hours / result.gpu_hours
            schedule, result = trial, checked
            if share == 0.0 and saved < TRIM_ENOUGH:
                break
    return SearchedSchedule(tuple(schedule), tuple(result.violating_minutes), runs, result)


@dataclass(frozen=True)
class MinuteBounds:
    per_minute: tuple[int, ...]  # the fewest replicas each minute meets its SLO with, played alone
    noisy: tuple[int, ...]  # minutes that missed alone with the schedule's replicas (counted so)
    runs: int  # one-minute simulations it took

    def gpu_hours(self, fleet: FleetConfig) -> float:
        return sum(self.per_minute) * fleet.gpus_per_replica / 60.0


def minute_bounds(
    profile: EngineProfile,
    trace: Sequence[Arrival],
    schedule: Sequence[int],
    fleet: FleetConfig | None = None,
    apa_config: AutoscalerConfig | None = None,
) -> MinuteBounds:
    """A lower bound on the replicas of any per-minute schedule that meets every minute: for each
    minute, the fewest replicas (bisected below `schedule`'s, which meets it) with which its
    arrivals, played alone on a fleet ready at the minute's start with nothing before them and
    ten times as many replicas from its end, meet the SLO. A schedule holds at least that many
    ready through the minute, and its requests fare no better with earlier ones queued beside
    them or fewer replicas after, so the sum bounds its GPU-hours (pod starts and the minutes'
    overlap only add to them). A bound under that monotonicity, which the router's random
    choices break at the margin: a minute that misses alone with the schedule's own replicas is
    counted at them (`noisy`). Worked numbers: a minute the schedule gives 20 replicas that
    meets alone with 14 and not 13 bounds it at 14."""
    replay = _AloneReplay(profile, trace, fleet or FleetConfig(), apa_config or AutoscalerConfig())
    lead = replay.fleet.pod_start_s  # replicas asked a pod start before the minute's end are ready then
    bounds: list[int] = []
    noisy: list[int] = []
    for minute, given in enumerate(schedule):
        alone = replay.slice(60.0 * minute)  # sliced once for every replica count tried
        if not alone:
            bounds.append(0)
            continue
        after = max(10 * given, given + 10)
        if not replay.meets(alone, given, after, lead):
            bounds.append(given)
            noisy.append(minute)
            continue
        bounds.append(replay.fewest(alone, given, after, lead))
    return MinuteBounds(tuple(bounds), tuple(noisy), replay.runs)


class _AloneReplay:
    """Replays of a minute of the trace played alone: its arrivals from a start, on a fleet of
    `replicas` ready then, with nothing before them, asking `after` replicas `lead_s` before
    the minute's end (lead 60 s: at once, ready a pod start later)."""

    def __init__(
        self,
        profile: EngineProfile,
        trace: Sequence[Arrival],
        fleet: FleetConfig,
        apa_config: AutoscalerConfig,
    ) -> None:
        self.profile, self.fleet, self.slo = profile, fleet, apa_config.latency_slo_s
        self.columns = as_trace(trace)
        self.batch = full_batch(profile, self.columns)  # the whole trace's, as a schedule runs with
        self.runs = 0

    def slice(self, start: float) -> Trace:
        """The arrivals of the 60 s from `start`, from time 0."""
        times = self.columns.times
        lo, hi = bisect.bisect_left(times, start), bisect.bisect_left(times, start + 60.0)
        alone = Trace()
        alone.extend(
            [t - start for t in times[lo:hi]],
            list(self.columns.prompts[lo:hi]),
            list(self.columns.outputs[lo:hi]),
        )
        return alone

    def meets(self, alone: Trace, replicas: int, after: int, lead_s: float) -> bool:
        config = replace(
            self.fleet, initial_replicas=replicas, max_replicas=max(self.fleet.max_replicas, after)
        )
        policy = Schedule(per_minute=(replicas, after), lead_s=lead_s, name="bound")
        self.runs += 1
        result = run(self.profile, alone, policy, config, replicas, self.slo, batch=self.batch)
        return not result.violating_minutes

    def fewest(self, alone: Trace, meets: int, after: int, lead_s: float) -> int:
        """The fewest replicas below `meets` (which meets) that meet, bisected."""
        fails = 0
        while meets - fails > 1:
            mid = (fails + meets) // 2
            if self.meets(alone, mid, after, lead_s):
                meets = mid
            else:
                fails = mid
        return meets


@dataclass(frozen=True)
class CausalFloor:
    per_minute: tuple[int, ...]  # the minute's bound, or `standing` where a burst may start
    bursts: tuple[float, ...]  # where the trace's bursts start, seconds
    standing: int  # the replicas the least of them needs ready when it starts (0: no burst)
    runs: int  # one-minute simulations it took

    def gpu_hours(self, fleet: FleetConfig) -> float:
        return sum(self.per_minute) * fleet.gpus_per_replica / 60.0


def burst_starts(trace: Sequence[Arrival], ratio: float) -> list[float]:
    """Where the trace's bursts start: the first of each run of 10-s spans (from time 0) with
    more than `ratio` x the arrivals of the mean 10 s of the 300 s before (at least half of
    those in the trace): the decider's rule for a burst (`calm.quiet_since`), on arrivals.
    Worked numbers (ratio 2.5): 30 a span, then 90: 3x, a burst starts; 60: 2x, none."""
    times = as_trace(trace).times
    if not times:
        return []
    starts: list[float] = []
    bursting = False
    span, base = CALM_SPAN_S, CALM_BASE_S
    for k in range(int(times[-1] // span) + 1):
        at = k * span
        seconds = min(base, at)
        if seconds < 0.5 * base:
            continue
        count = bisect.bisect_left(times, at + span) - bisect.bisect_left(times, at)
        before = bisect.bisect_left(times, at) - bisect.bisect_left(times, at - seconds)
        burst = count > ratio * before * span / seconds
        if burst and not bursting:
            starts.append(at)
        bursting = burst
    return starts


def causal_floor(
    profile: EngineProfile,
    trace: Sequence[Arrival],
    bounds: MinuteBounds,
    fleet: FleetConfig | None = None,
    apa_config: AutoscalerConfig | None = None,
    window: tuple[float, float] = BURST_WINDOW,
) -> CausalFloor:
    """A lower bound on the GPU-hours of any policy that sees a burst only when it comes and
    meets every minute of every trace drawn like this one. A burst's first seconds are served
    by the replicas ready when it starts: pods asked then are ready a pod start later. So for
    each burst, the fewest replicas with which its 60 s from its start, played alone (nothing
    before; ten times as many asked at its first second, ready a pod start later), meet the SLO;
    the least of these over the trace's bursts is `standing`. Drawn like this trace, a burst
    may start at any 10 s in `window` (the generators' `traces.BURST_WINDOW`) whatever came
    before, so such a policy keeps `standing` ready in every minute of it, and the minute's
    own bound (`minute_bounds`) everywhere. A trace without bursts is floored at its bounds.
    Worked numbers: bounds of 3 a minute, 30 minutes, bursts that need 40 standing: minutes
    3-26 at 40, the others at 3: 978 replica-minutes against the bounds' 90."""
    apa_config = apa_config or AutoscalerConfig()
    replay = _AloneReplay(profile, trace, fleet or FleetConfig(), apa_config)
    starts = burst_starts(trace, apa_config.burst_ratio)
    standing = 0
    for at in starts:
        alone = replay.slice(at)
        meets = max(1, max(bounds.per_minute))
        while not replay.meets(alone, meets, 10 * meets, 60.0):  # beyond every minute's bound
            meets *= 2
            if meets > replay.fleet.max_replicas:
                break  # beyond the fleet's ceiling: no policy meets it, left out like `unmet`
        else:
            need = replay.fewest(alone, meets, 10 * meets, 60.0)
            standing = need if not standing else min(standing, need)
    minutes = len(bounds.per_minute)
    first, last = window[0] * 60.0 * minutes, window[1] * 60.0 * minutes
    per_minute = tuple(
        max(b, standing) if first <= 60.0 * m < last else b for m, b in enumerate(bounds.per_minute)
    )
    return CausalFloor(per_minute, tuple(starts), standing, replay.runs)


def burst_minutes(floor: CausalFloor, seconds: float = 60.0) -> tuple[int, ...]:
    """The minutes that overlap a burst's first `seconds` (the span `causal_floor` plays alone):
    what a policy that sees the burst only when it comes serves with what stood when it came.
    Worked numbers: bursts at 340 s and 900 s -> [340, 400) and [900, 960): minutes 5, 6, 15.
    Left out of a score, they relax the Goal: the bench's restated Goal, not the issue's."""
    end = len(floor.per_minute)  # none past the trace's last minute
    minutes = {
        m for at in floor.bursts for m in range(int(at // 60), min(math.ceil((at + seconds) / 60.0), end))
    }
    return tuple(sorted(minutes))


@dataclass(frozen=True)
class Burst:
    """What the fleet did around one burst (diagnose)."""

    start_s: float
    seconds: float
    had: int  # replicas ready at the burst's start
    needed: int  # replicas the searched oracle held in the burst's first minute
    asked_s: float | None  # seconds from the start to the first ask for more, None: none
    came_s: float | None  # seconds from the start to the first new replica ready, None: none
    longest_queue: int  # requests waiting at the router, the most during the burst
    met: bool  # every minute the burst touches met the SLO


def diagnose(
    spans: Sequence[tuple[float, float]], timeline: Sequence[Second], schedule: Sequence[int], result: Result
) -> list[Burst]:
    """Each burst of `spans` as the run's `timeline` (a row per second) saw it, against the
    searched oracle's per-minute `schedule`: the fleet at its first second, and an ask or a
    replica more than then counted up to a minute after its end."""
    missed = set(result.violating_minutes)
    out = []
    for start, end in spans:
        during = [s for s in timeline if start <= s.time_s < end + 60.0]
        if not during:
            continue
        first = during[0]
        asked = next((s.time_s - start for s in during if s.desired > first.desired), None)
        came = next((s.time_s - start for s in during if s.ready > first.ready), None)
        minute = int(start // 60)
        minutes = range(minute, int(end // 60) + 1)
        out.append(
            Burst(
                start,
                end - start,
                first.ready,
                schedule[min(minute, len(schedule) - 1)],
                asked,
                came,
                max((s.queued for s in during if s.time_s < end), default=0),
                not any(m in missed for m in minutes),
            )
        )
    return out


def attainment_without(result: Result, excluded: Sequence[int]) -> float:
    """SLO attainment over the minutes not in `excluded` (those no schedule met)."""
    gone = set(excluded)
    kept = [m for m in result.minutes if m.minute not in gone]
    if not kept:
        return 1.0
    return 1.0 - sum(1 for m in kept if m.p99_slo_ratio > 1.0) / len(kept)


def simulate(
    profile: EngineProfile,
    trace: Sequence[Arrival],
    policy: str,
    fleet: FleetConfig | None = None,
    apa_config: AutoscalerConfig | None = None,
    oracle_margin: float = 0.9,
    warmup_s: float = 300.0,
    schedule: Sequence[int] | None = None,
    decisions: DecisionLog | None = None,  # apa's decisions with their inputs go here
    timeline: list[Second] | None = None,  # each measured second's fleet goes here
    peer_target: float | None = None,  # hpa's or kpa's target per pod (make_policy)
) -> Result:
    """Run `policy` on `trace`. Every policy starts warm at the oracle's first-minute replicas
    (static-peak at its peak) and with `warmup_s` of history (the trace's first minutes played
    once before it backwards in time, unmeasured, under the oracle, so that the load it ends on
    is the load minute 0 starts with), so the comparison is about following load,
    not a cold start. `schedule` replaces the oracle's own (see `searched_oracle`)."""
    if not trace:
        raise ValueError("the trace is empty")
    fleet = fleet or FleetConfig()
    apa_config = apa_config or AutoscalerConfig()
    # A replica's capacity at the SLO, as the capacity benchmark would publish it: apa's
    # mu_per_replica_minute and the oracle's unit. hpa and kpa keep their own defaults.
    batch = full_batch(profile, trace)  # one pass over the trace for all three below
    capacity = 0.0  # seconds of simulation on a fleet: only where apa or the schedule needs it
    if schedule is None or policy == "apa":
        capacity = slo_capacity_mu_per_s(
            profile, trace, fleet.slo_first_token_s, fleet.slo_per_output_token_s, batch=batch
        )
    if schedule is None:
        schedule = oracle_schedule(profile, trace, capacity, margin=oracle_margin, batch=batch)
    peak = max(schedule)
    first = max(schedule[0], fleet.min_replicas, 1)
    start = peak if policy == "static-peak" else first
    fleet = replace(fleet, initial_replicas=min(max(start, fleet.min_replicas), fleet.max_replicas))
    if policy in UNLIMITED and not fleet.target_concurrency:
        fleet = replace(fleet, target_concurrency=NO_LIMIT)
    chosen = make_policy(policy, schedule, fleet, apa_config, warmup_s, capacity * 60.0, peer_target)
    if isinstance(chosen, Apa):
        chosen.decisions = decisions
    return run(
        profile,
        trace,
        chosen,
        fleet,
        static_peak_replicas=peak,
        slo_scale=apa_config.latency_slo_s,
        warmup_s=warmup_s,
        warmup_policy=make_policy("oracle", schedule, fleet, apa_config, warmup_s),
        batch=batch,
        timeline=timeline,
    )


def searched_oracle(
    profile: EngineProfile,
    trace: Sequence[Arrival],
    fleet: FleetConfig | None = None,
    apa_config: AutoscalerConfig | None = None,
    oracle_margin: float = 0.9,
    warmup_s: float = 300.0,
) -> SearchedSchedule:
    """The oracle's schedule searched with the simulator (`search_schedule`), from its own."""
    fleet = fleet or FleetConfig()
    batch = full_batch(profile, trace)
    capacity = slo_capacity_mu_per_s(
        profile, trace, fleet.slo_first_token_s, fleet.slo_per_output_token_s, batch=batch
    )
    start = oracle_schedule(profile, trace, capacity, margin=oracle_margin, batch=batch)

    def replay(per_minute: Sequence[int]) -> Result:
        return simulate(profile, trace, "oracle", fleet, apa_config, oracle_margin, warmup_s, per_minute)

    return search_schedule(start, replay, fleet.max_replicas)
