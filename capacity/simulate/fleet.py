"""The fleet: a router, replicas that start, serve and drain, and a policy in the loop. Pure.

Simulated time only: every `tick_s` (0.5 s) the fleet advances each replica, dispatches the
router's queue, meters a sample into the current 1-second `Bucket`, integrates GPU time and asks
the policy on its cadence; arrivals between ticks are routed at their own time, by power of two
choices on in-flight MU as the router's p2c-mu does. A minute meets the SLO when the p99 of its
requests' ratios to each deadline (TTFT, ITL, end to end: `replica.slo_ratios`) is <= 1, a
rejected request counting as infinitely late. Memory follows the requests in flight, not the
trace (a day of a 200-replica fleet is ~10^8 requests): keep it so. The loop in full:
docs/capacity-model.md, "The fleet simulator's loop"; the deadlines: docs/autoscaler.md.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from capacity.autoscaler import Bucket
from capacity.simulate.arrivals import Arrival, as_trace
from capacity.simulate.percentiles import Percentiles
from capacity.simulate.policies import FleetState, ScalingPolicy
from capacity.simulate.replica import Replica, Request, end_to_end_deadline_s, p99, slo_ratios
from capacity.simulate.sizing import cost_model_for, fit_shape, full_batch
from engine_model.perf_model import EngineProfile

BUCKET_S = 1.0  # the router's metering resolution, seconds


@dataclass(frozen=True)
class FleetConfig:
    pod_start_s: float = 30.0  # ask -> ready, seconds (image pull, model load); >= 0
    gpus_per_replica: int = 1  # GPUs one replica holds; >= 1
    tick_s: float = 0.5  # how often every replica is advanced and metered, seconds; (0, 1]
    queue_limit: int = 100_000  # most requests waiting at the router; >= 0
    queue_timeout_s: float = 60.0  # a request waiting longer is rejected, seconds; > 0
    slo_first_token_s: float = 5.0  # the first token's queueing budget beyond its prefill, seconds; > 0
    slo_per_output_token_s: float = 0.1  # seconds per output token; > 0
    min_replicas: int = 1  # 0 allows scale to zero; >= 0
    max_replicas: int = 5000  # >= max(1, min_replicas)
    initial_replicas: int = 1  # ready at time 0 (a warm start); within [min, max]
    target_concurrency: int = 0  # router limit per replica at start; 0: the profile's full batch
    seed: int = 0  # the router's random choices

    def __post_init__(self) -> None:
        checks = [
            ("pod_start_s", self.pod_start_s >= 0),
            ("gpus_per_replica", self.gpus_per_replica >= 1),
            ("tick_s", 0 < self.tick_s <= BUCKET_S),
            ("queue_limit", self.queue_limit >= 0),
            ("queue_timeout_s", self.queue_timeout_s > 0),
            ("slo_first_token_s", self.slo_first_token_s > 0),
            ("slo_per_output_token_s", self.slo_per_output_token_s > 0),
            ("min_replicas", self.min_replicas >= 0),
            ("max_replicas", self.max_replicas >= max(1, self.min_replicas)),
            ("initial_replicas", self.min_replicas <= self.initial_replicas <= self.max_replicas),
            ("target_concurrency", self.target_concurrency >= 0),
        ]
        for key, ok in checks:
            if not ok:
                raise ValueError(
                    f"fleet setting {key}={getattr(self, key)!r} is out of range (see FleetConfig)"
                )

    def deadline_s(self, profile: EngineProfile, prompt_tokens: int, output_tokens: int) -> float:
        """A request's end-to-end deadline: `replica.end_to_end_deadline_s` with this SLO."""
        return end_to_end_deadline_s(
            self.slo_first_token_s, self.slo_per_output_token_s, profile, prompt_tokens, output_tokens
        )


@dataclass(frozen=True)
class MinuteStats:
    minute: int  # minutes since the trace's start
    requests: int  # arrivals in the minute
    p99_slo_ratio: float  # the worst p99 of latency, TTFT and ITL over deadline (inf: >1 % rejected)
    replicas: float  # mean replicas provisioned (starting, ready, draining)
    p99_ttft_ratio: float = math.nan  # p99 of TTFT / its deadline, completed requests
    p99_itl_ratio: float = math.nan  # p99 of ITL / per_output_token_s, completed requests


class Second(NamedTuple):
    """The fleet at the end of one measured second (run's `timeline`)."""

    time_s: float  # since the trace's start
    desired: int  # replicas asked for (starting and ready)
    ready: int  # replicas serving
    queued: int  # requests waiting at the router


@dataclass(frozen=True)
class Result:
    policy: str
    requests: int  # arrivals replayed
    duration_s: float  # simulated seconds of the trace (GPU time is counted over this)
    gpu_hours: float  # provisioned replicas x GPUs, integrated over the trace, hours
    static_peak_gpu_hours: float  # the peak minute's replicas all the time, hours
    slo_attainment: float  # share of minutes with traffic whose p99 latency / deadline <= 1
    p99_latency_s: float  # end to end, completed requests, seconds (to 0.05 %: `Percentiles`)
    p99_slo_ratio: float  # p99 of latency / deadline over all requests (rejected: inf; to 0.05 %)
    rejected_fraction: float  # share of arrivals rejected by the router
    scale_events: int  # changes of the desired replica count
    mean_replicas: float
    peak_replicas: int  # most replicas provisioned at once
    violating_minutes: tuple[int, ...]  # minutes whose p99 missed the SLO
    minutes: tuple[MinuteStats, ...]


@dataclass(slots=True)
class _Minute:
    """A minute's requests (by arrival) while some still run: the minute is scored once all end."""

    running: int = 0
    ratios: list[float] = field(default_factory=list)  # latency / deadline; rejected: inf
    ttft: list[float] = field(default_factory=list)  # TTFT / its deadline, completed
    itl: list[float] = field(default_factory=list)  # ITL / per_output_token_s, completed
    latencies: list[float] = field(default_factory=list)  # completed, seconds


@dataclass
class _Meter:
    """One bucket's running sums."""

    samples: int = 0
    in_flight: float = 0.0
    queued: float = 0.0
    mu: float = 0.0
    mu_squared: float = 0.0
    requests: int = 0
    queue_depth: int = 0
    kv: float = 0.0
    errors: int = 0
    ratios: list[float] = field(default_factory=list)


class Fleet:
    def __init__(
        self,
        profile: EngineProfile,
        policy: ScalingPolicy,
        config: FleetConfig,
        batch: int,
        static_peak_replicas: int,
    ) -> None:
        self.profile, self.policy, self.config = profile, policy, config
        self.cost = cost_model_for(profile, batch)
        self.target = config.target_concurrency or batch
        self.static_peak_replicas = static_peak_replicas
        self.rng = random.Random(config.seed)
        self.replicas: list[Replica] = []  # every provisioned replica, draining included
        self.room: list[Replica] = []  # ready, not draining, under the limit
        self.room_at: dict[int, int] = {}  # replica name -> index in room
        self.queue: deque[Request] = deque()
        self.queue_mu = 0.0  # MU of the requests in the router's queue
        self.next_name = 0
        self.desired = 0
        self.scale_events = 0
        self.buckets: deque[Bucket] = deque()
        self.meter = _Meter()
        self.gpu_seconds = 0.0
        self.peak = 0
        self.rejected = 0
        self.open_minutes: dict[int, _Minute] = {}  # by arrival, measured only
        # closed: minute -> (requests, worst p99 ratio, p99 TTFT ratio, p99 ITL ratio)
        self.minute_p99: dict[int, tuple[int, float, float, float]] = {}
        self.minute_replicas: dict[int, float] = {}
        self.latencies = Percentiles()  # end to end, completed requests, of closed minutes
        self.ratios = Percentiles()  # latency / deadline (rejected: inf), of closed minutes
        self.next_policy = 0.0
        self.measure_from = 0.0  # simulated seconds: before this is warm-up, not measured
        self.warmup_policy: ScalingPolicy | None = None  # scales the fleet during the warm-up
        self.timeline: list[Second] | None = None  # each measured second, when asked for (run)
        for _ in range(config.initial_replicas):
            self._add(0.0, ready_at=0.0)
        self.desired = config.initial_replicas

    # --- replicas ---------------------------------------------------------------------------

    def _add(self, now: float, ready_at: float) -> None:
        rep = Replica(self.profile, self.next_name, ready_at=ready_at, started_at=now, clock=ready_at)
        self.next_name += 1
        self.replicas.append(rep)
        self._update_room(rep, now)

    def _update_room(self, rep: Replica, now: float) -> None:
        eligible = rep.ready_at <= now and not rep.draining and rep.in_flight < self.target
        at = self.room_at.get(rep.name)
        if eligible and at is None:
            self.room_at[rep.name] = len(self.room)
            self.room.append(rep)
        elif not eligible and at is not None:
            last = self.room.pop()
            if last is not rep:
                self.room[at] = last
                self.room_at[last.name] = at
            del self.room_at[rep.name]

    def _scale_to(self, wanted: int, now: float) -> None:
        if wanted != self.desired and now >= self.measure_from:
            self.scale_events += 1
        self.desired = wanted
        active = [r for r in self.replicas if not r.draining]
        for _ in range(wanted - len(active)):
            self._add(now, ready_at=now + self.config.pod_start_s)
        excess = len(active) - wanted
        if excess > 0:
            # Cancel the newest starting pods first, then drain the least busy ready ones.
            order = sorted(active, key=lambda r: (r.ready_at <= now, r.in_flight, -r.started_at))
            for rep in order[:excess]:
                rep.draining = True
                self._update_room(rep, now)
            self.replicas = [r for r in self.replicas if not (r.draining and not r.has_work())]

    # --- requests ---------------------------------------------------------------------------

    def _finish(self, rep: Replica, done: list[Request], now: float) -> None:
        cfg, prefill = self.config, self.profile.prefill_per_token_s
        for req in done:
            ratio, ttft, itl = slo_ratios(req, cfg.slo_first_token_s, cfg.slo_per_output_token_s, prefill)
            self.meter.ratios.append(ratio)
            if req.arrival_s >= self.measure_from:
                minute = self.open_minutes[self._minute(req.arrival_s)]
                minute.ratios.append(ratio)
                minute.ttft.append(ttft)
                minute.itl.append(itl)
                minute.latencies.append(req.finished_s - req.arrival_s)
                minute.running -= 1
        self._update_room(rep, now)

    def _minute(self, t: float) -> int:
        return int((t - self.measure_from) // 60)

    def _close_minutes(self, now: float) -> None:
        """Score every minute that is over and whose requests have all ended, and let go of its
        requests' numbers (a day of a large fleet has 10^8 of them)."""
        for key, minute in list(self.open_minutes.items()):
            if minute.running == 0 and self.measure_from + 60.0 * (key + 1) <= now:
                ttft, itl = p99(minute.ttft), p99(minute.itl)  # nan when every request was rejected
                worst = max(p99(minute.ratios), *(x for x in (ttft, itl) if not math.isnan(x)))
                self.minute_p99[key] = (len(minute.ratios), worst, ttft, itl)
                self.ratios.add_many(minute.ratios)
                self.latencies.add_many(minute.latencies)
                del self.open_minutes[key]

    def _reject(self, req: Request) -> None:
        self.meter.errors += 1
        if req.arrival_s >= self.measure_from:
            self.rejected += 1
            minute = self.open_minutes[self._minute(req.arrival_s)]
            minute.ratios.append(math.inf)
            minute.running -= 1

    def _pick(self, now: float) -> Replica | None:
        """Power of two choices on in-flight MU among replicas with room, the MU of requests not
        answered yet counted again (the router's p2c-mu)."""
        room, random = self.room, self.rng.random
        while room:
            n = len(room)
            # Two distinct replicas, uniformly: i, then j among the other n - 1.
            i = int(random() * n)
            j = int(random() * (n - 1))
            a, b = room[i], room[j + (j >= i)] if n > 1 else room[i]
            for rep in (a, b) if a is not b else (a,):
                if rep.clock < now and (done := rep.advance_to(now)):
                    self._finish(rep, done, now)
            best = a if a.load_mu() <= b.load_mu() else b
            if best.name in self.room_at:
                return best
        return None

    def _dispatch(self, req: Request, now: float) -> bool:
        rep = self._pick(now)
        if rep is None:
            return False
        rep.submit(req, now)
        self._update_room(rep, now)
        return True

    def arrive(self, now: float, prompt_tokens: int, output_tokens: int, seq: int) -> None:
        """A request reaches the router at `now` (the caller advanced the fleet to the tick before)."""
        prompt, output = fit_shape(self.profile, prompt_tokens, output_tokens)
        deadline = self.config.deadline_s(self.profile, prompt, output)
        req = Request(now, prompt, output, deadline, self.cost.cost(prompt, output), seq)
        if now >= self.measure_from:
            key = self._minute(now)
            minute = self.open_minutes.get(key)
            if minute is None:
                minute = self.open_minutes[key] = _Minute()
            minute.running += 1
        self.meter.requests += 1
        self.meter.mu += req.mu
        self.meter.mu_squared += req.mu * req.mu
        if not self.queue and self._dispatch(req, now):
            return
        if len(self.queue) >= self.config.queue_limit:
            self._reject(req)
        else:
            self.queue.append(req)
            self.queue_mu += req.mu

    def _dequeue(self) -> Request:
        req = self.queue.popleft()
        self.queue_mu -= req.mu
        return req

    # --- the clock --------------------------------------------------------------------------

    def tick(self, now: float, counting: bool) -> None:
        cfg = self.config
        for rep in self.replicas:
            if rep.clock < now and (done := rep.advance_to(now)):
                self._finish(rep, done, now)
            if rep.waiting:
                for req in rep.expire(now - cfg.queue_timeout_s):  # the same patience in an engine queue
                    self._reject(req)
            if rep.ready_at <= now and rep.name not in self.room_at:
                self._update_room(rep, now)
        self.replicas = [r for r in self.replicas if not (r.draining and not r.has_work())]
        while self.queue and self.queue[0].arrival_s < now - cfg.queue_timeout_s:
            self._reject(self._dequeue())
        while self.queue and self._dispatch(self.queue[0], now):
            self._dequeue()
        if not self.queue:
            self.queue_mu = 0.0  # no float drift
        # As the Bucket says: requests at the replicas, and apart from them the router's queue
        # (`queued`, and its MU as `backlog_mu`), as the production router meters them.
        in_flight = sum(r.in_flight for r in self.replicas)
        # The engines' real queue only (no slot or no KV). The router's own queue is a backlog
        # of demand (its MU is in mu_per_minute at arrival); fed to the vertical decider as
        # "overload" it would ratchet the target down for ever (a smaller target makes a longer
        # router queue). Requests that just arrived during a step are not a queue either: a
        # 0.3 s prefill step of 8k tokens holds ~2 arrivals per replica at 8 QPS, over the
        # decider's "1 waiting per replica".
        waiting = sum(r.blocked() for r in self.replicas)
        m = self.meter
        m.samples += 1
        m.in_flight += in_flight
        m.queued += len(self.queue)
        m.queue_depth = max(m.queue_depth, waiting)
        m.kv = max([m.kv, *(r.kv_usage() for r in self.replicas)])
        if counting:
            self.gpu_seconds += len(self.replicas) * cfg.gpus_per_replica * cfg.tick_s
            self.peak = max(self.peak, len(self.replicas))
            minute = self._minute(now - cfg.tick_s / 2)
            self.minute_replicas[minute] = self.minute_replicas.get(minute, 0.0) + len(self.replicas)
        if now + 1e-9 >= math.ceil(now - 1e-9):  # a whole second: close the bucket
            self._close_bucket(now)
            self._close_minutes(now)
            if self.timeline is not None and counting:
                ready = sum(1 for r in self.replicas if r.ready_at <= now and not r.draining)
                self.timeline.append(Second(now - self.measure_from, self.desired, ready, len(self.queue)))
        if now + 1e-9 >= self.next_policy:
            self._decide(now)
            self.next_policy = now + self.policy.tick_s

    def _close_bucket(self, now: float) -> None:
        m = self.meter
        p99_ratio = p99(m.ratios)
        self.buckets.append(
            Bucket(
                end=round(now, 6),
                seconds=BUCKET_S,
                in_flight=m.in_flight / max(m.samples, 1),
                mu_per_minute=m.mu * 60.0 / BUCKET_S,
                requests=m.requests,
                queue_depth=float(m.queue_depth),
                # In "SLO seconds": p99 of latency / deadline x the autoscaler's latency_slo_s,
                # so its vertical decider judges long answers by their own deadline.
                p99_latency_s=None if math.isnan(p99_ratio) else p99_ratio * self.slo_scale,
                kv_cache_usage=m.kv,
                errors=m.errors,
                backlog_mu=max(self.queue_mu, 0.0),
                queued=m.queued / max(m.samples, 1),
                mu_squared_per_minute=m.mu_squared * 60.0 / BUCKET_S,
            )
        )
        while self.buckets and self.buckets[0].end <= now - self.policy.history_s:
            self.buckets.popleft()
        self.meter = _Meter()

    slo_scale = 10.0  # the apa config's latency_slo_s; set by run()

    def _decide(self, now: float) -> None:
        ready = sum(1 for r in self.replicas if r.ready_at <= now and not r.draining)
        state = FleetState(
            self.desired, ready, self.target, self.config.min_replicas, self.config.max_replicas
        )
        if now < self.measure_from and self.warmup_policy is not None:
            self._scale_to(self.warmup_policy.decide(state, self.buckets, now), now)
            return
        target = self.policy.concurrency(state, self.buckets, now)
        if target != self.target:
            self.target = target
            for rep in self.replicas:
                self._update_room(rep, now)
        self._scale_to(self.policy.decide(state, self.buckets, now), now)

    def has_work(self) -> bool:
        return bool(self.queue) or any(r.has_work() for r in self.replicas)


def warmup_time(t: float, warmup_s: float) -> float:
    """When the warm-up replays the arrival at trace time t (< warmup_s): mirrored, so that the
    load the warm-up ends on is the load the measured trace starts with. Played forwards, the
    warm-up ended on minute 4's load and the measured run stepped from it to minute 0's, a step
    no deployment sees, and a policy that follows its load missed minute 0 for it (prefill-1).
    Worked numbers, warm-up 300 s: trace time 10 s -> 290 s, 299 s -> 1 s; 0 s -> just under
    300 s (before the measured minute 0 starts)."""
    return min(warmup_s - t, math.nextafter(warmup_s, 0.0))


def run(
    profile: EngineProfile,
    trace: Sequence[Arrival],
    policy: ScalingPolicy,
    config: FleetConfig,
    static_peak_replicas: int,
    slo_scale: float = 10.0,
    warmup_s: float = 0.0,
    warmup_policy: ScalingPolicy | None = None,
    batch: int | None = None,  # full_batch(profile, trace), when the caller has it
    timeline: list[Second] | None = None,  # each measured second's fleet goes here
) -> Result:
    """Replay `trace` through a fleet driven by `policy`; every number in Result is measured.

    With `warmup_s`, the trace's first `warmup_s` play once before it, unmeasured and mirrored
    in time (`warmup_time`), scaled by `warmup_policy` (the oracle), so that every policy takes
    over a fleet sized for the load with the metering history a running deployment has (given
    10 s of history, apa's decider would hold the warm fleet until its samples cover half its
    down window, hpa's and kpa's would judge on seconds of metrics)."""
    batch = batch or full_batch(profile, trace)
    fleet = Fleet(profile, policy, config, batch, static_peak_replicas)
    fleet.slo_scale = slo_scale
    fleet.timeline = timeline
    # Every minute with an arrival, whole: a lone arrival at 0 s (or the last on a minute's
    # first instant) has its minute counted, where rounding its time up counted nothing.
    duration = (math.floor(trace[-1].time_s / 60.0) + 1) * 60.0 if trace else 0.0
    measured = len(trace)
    columns = as_trace(trace)
    times, prompts, outputs = columns.times, columns.prompts, columns.outputs
    # The warm-up plays the trace's first `warmup_s` (rows 0..prefix-1) backwards in time, then
    # the whole trace follows, shifted by warmup_s: arrival k is row prefix-1-k, then k - prefix.
    prefix = bisect.bisect_left(times, warmup_s) if warmup_s > 0 else 0
    total = prefix + measured
    fleet.measure_from = warmup_s
    fleet.warmup_policy = warmup_policy
    duration += warmup_s
    tick = config.tick_s
    steps = 0
    k = 0
    while True:
        steps += 1
        now = steps * tick
        while k < total:
            if k < prefix:
                row = prefix - 1 - k
                t = warmup_time(times[row], warmup_s)
            else:
                row = k - prefix
                t = times[row] + warmup_s
            if t >= now:
                break
            fleet.arrive(t, prompts[row], outputs[row], k)
            k += 1
        fleet.tick(now, counting=warmup_s < now <= duration + 1e-9)
        if now >= duration and k >= total and not fleet.has_work():
            break
        if now > duration + 4 * config.queue_timeout_s + 3600:
            raise RuntimeError("fleet did not drain an hour after the trace ended")
    fleet._close_minutes(math.inf)

    minutes = []
    violating = []
    samples_per_minute = 60.0 / tick
    for minute, (requests, worst, ttft, itl) in sorted(fleet.minute_p99.items()):
        if worst > 1.0:
            violating.append(minute)
        replicas = fleet.minute_replicas.get(minute, 0.0) / samples_per_minute
        minutes.append(MinuteStats(minute, requests, worst, replicas, ttft, itl))
    gpu_hours = fleet.gpu_seconds / 3600.0
    duration -= warmup_s
    return Result(
        policy=policy.name,
        requests=measured,
        duration_s=duration,
        gpu_hours=gpu_hours,
        static_peak_gpu_hours=static_peak_replicas * config.gpus_per_replica * duration / 3600.0,
        slo_attainment=1.0 - len(violating) / len(minutes) if minutes else 1.0,
        p99_latency_s=fleet.latencies.value(0.99),
        p99_slo_ratio=fleet.ratios.value(0.99),
        rejected_fraction=fleet.rejected / measured if measured else 0.0,
        scale_events=fleet.scale_events,
        mean_replicas=gpu_hours * 3600.0 / config.gpus_per_replica / duration if duration else 0.0,
        peak_replicas=fleet.peak,
        violating_minutes=tuple(violating),
        minutes=tuple(minutes),
    )


__all__ = ["FleetConfig", "MinuteStats", "Result", "Second", "run", "warmup_time"]
