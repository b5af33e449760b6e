"""One simulation from names: a profile, a trace, a policy; the oracle and static peak sized from
the trace. Pure. The CLI and the bench both go through `simulate`.

With `oracle_search`, the oracle's schedule is searched with the simulator itself, not only
computed from the busiest 10 s of each minute (`search_schedule`): a greedy repair, then trims
down to one replica at a time: a schedule that meets every minute it can, close to the fewest
replicas, not a proof of the fewest. Minutes it still misses with the fleet's ceiling (or after
its rounds) are `unmet`: the bench leaves them out of every policy's score and shows them apart.
`minute_bounds` bounds it from below: the fewest replicas each minute needs played alone."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from capacity.autoscaler import AutoscalerConfig
from capacity.simulate.arrivals import Arrival, Trace, as_trace
from capacity.simulate.fleet import FleetConfig, Result, run
from capacity.simulate.policies import Apa, DecisionLog, Hpa, Kpa, ScalingPolicy, Schedule
from capacity.simulate.sizing import (
    full_batch,
    oracle_schedule,
    slo_capacity_mu_per_s,
)
from capacity.units import MU_PER_REPLICA_MINUTE
from dataplane.runtime.perf_model import EngineProfile

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
) -> ScalingPolicy:
    if name == "apa":
        return Apa(mu_per_replica_minute, scale_to_zero=fleet.min_replicas == 0, config=apa_config)
    if name == "hpa":
        return Hpa()
    if name == "kpa":
        return Kpa()
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
    a proof (README, issue 23, for what they took off on the bench's traces)."""
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
    fleet = fleet or FleetConfig()
    apa_config = apa_config or AutoscalerConfig()
    columns = as_trace(trace)
    batch = full_batch(profile, columns)  # the whole trace's, as the schedule ran with
    times = columns.times
    runs = 0

    def meets_alone(alone: Trace, replicas: int, after: int) -> bool:
        nonlocal runs
        config = replace(fleet, initial_replicas=replicas, max_replicas=max(fleet.max_replicas, after))
        policy = Schedule(per_minute=(replicas, after), lead_s=fleet.pod_start_s, name="bound")
        runs += 1
        result = run(profile, alone, policy, config, replicas, apa_config.latency_slo_s, batch=batch)
        return not result.violating_minutes

    bounds: list[int] = []
    noisy: list[int] = []
    for minute, given in enumerate(schedule):
        # The minute's arrivals, from its start: sliced once for every replica count tried.
        lo, hi = bisect.bisect_left(times, 60.0 * minute), bisect.bisect_left(times, 60.0 * (minute + 1))
        if lo == hi:
            bounds.append(0)
            continue
        alone = Trace()
        alone.extend(
            [t - 60.0 * minute for t in times[lo:hi]],
            list(columns.prompts[lo:hi]),
            list(columns.outputs[lo:hi]),
        )
        after = max(10 * given, given + 10)
        if not meets_alone(alone, given, after):
            bounds.append(given)
            noisy.append(minute)
            continue
        fails, meets = 0, given
        while meets - fails > 1:
            mid = (fails + meets) // 2
            if meets_alone(alone, mid, after):
                meets = mid
            else:
                fails = mid
        bounds.append(meets)
    return MinuteBounds(tuple(bounds), tuple(noisy), runs)


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
    chosen = make_policy(policy, schedule, fleet, apa_config, warmup_s, capacity * 60.0)
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
