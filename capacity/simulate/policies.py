"""Scaling policies the fleet simulator drives, one interface: `decide(state, buckets, now) -> replicas`.

Each policy is a small object with its own cadence (`tick_s`) and whatever memory its upstream
algorithm keeps (HPA's recommendations, KPA's panic mode); time is always passed in. The fleet
calls `decide` every `tick_s` with the router's 1-second `Bucket`s (in flight at the replicas
and waiting at the router, time-averaged; MU/min, arrivals, queue depth, p99, KV) and
`concurrency` to learn the router's per-replica limit.

- `apa`: ours, `capacity.autoscaler` unchanged: `decide` every 5 s on 5-second buckets (each
  with the MU waiting at the router, `backlog_mu`), `decide_concurrency` every 30 s (the router's
  per-replica limit); its replica capacity is the trace's rate at the SLO (see scenario). With
  `predictive_min` on, it keeps each minute's MU/min, as the control plane's history does, and
  `forecast` raises its floor ahead of a peak that recurs daily or weekly.
- `hpa`: Kubernetes HorizontalPodAutoscaler v2 (pkg/controller/podautoscaler/horizontal.go) with
  its defaults: 15 s sync (--horizontal-pod-autoscaler-sync-period), tolerance 0.1,
  desired = ceil(ready x metric / target) unless |metric / target - 1| <= 0.1, scale-up
  policies "4 pods or 100 % per 15 s, whichever is more" and no up stabilisation, scale-down
  stabilisation 300 s (the highest recommendation of the last 5 min), down policy 100 % per
  15 s. The metric is a Pods metric, average in-flight requests per ready pod over the last
  sync period, against a target of 70 (Knative's default, so the two peers share a metric);
  requests waiting at the router are on no pod, so they are not in it.
- `kpa`: Knative Serving's KPA (pkg/autoscaler/scaling/autoscaler.go) with config-autoscaler
  defaults: target 100 x 70 % = 70 concurrent requests per pod (those the router holds
  included, as the activator reports its buffer), stable window 60 s, panic
  window 10 % of it (6 s), panic threshold 200 %, max scale-up rate 1000, max scale-down rate 2,
  2 s tick. Panic mode never scales down and holds until the stable window has passed without
  crossing the threshold.
- `oracle`: clairvoyant; a per-minute schedule from the trace (see `oracle_schedule`), each
  minute's replicas asked for a pod start time ahead. Its GPU-hours are the floor.
- `static-peak`: the oracle's peak minute, all the time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from capacity.autoscaler import (
    AutoscalerConfig,
    Bucket,
    Decision,
    EndpointSpec,
    calm,
    decide,
    decide_concurrency,
)
from capacity.autoscaler.forecast import predicted_min_replicas
from capacity.autoscaler.horizontal import lookback_s
from capacity.autoscaler.series import Series, carried, held
from capacity.autoscaler.window import Timeline, aggregate
from capacity.units import MU_PER_REPLICA_MINUTE

# apa's horizontal decisions with their inputs: (now, the scale-up window's MU/min, in flight,
# waiting at the router, backlog MU, the Decision), for the bench's per-minute series.
DecisionLog = list[tuple[float, float, float, float, float, Decision]]


@dataclass(frozen=True)
class FleetState:
    desired: int  # replicas last asked for (starting + ready, not draining), >= 0
    ready: int  # replicas serving now, >= 0
    target_concurrency: int  # the router's per-replica limit now, requests, >= 1
    min_replicas: int  # the endpoint's floor, >= 0
    max_replicas: int  # the endpoint's ceiling, >= min_replicas


class ScalingPolicy:
    """Hold what you have: the base every policy refines."""

    name = "hold"
    tick_s = 5.0  # seconds between horizontal decisions
    history_s = 660.0  # seconds of buckets the fleet keeps for it: the longest it reads back

    def decide(self, state: FleetState, buckets: Sequence[Bucket], now: float) -> int:
        return state.desired

    def concurrency(self, state: FleetState, buckets: Sequence[Bucket], now: float) -> int:
        """The router's per-replica limit from now on (only apa changes it)."""
        return state.target_concurrency

    @staticmethod
    def clamp(state: FleetState, replicas: int) -> int:
        return min(max(replicas, state.min_replicas), state.max_replicas)


def merge(buckets: Sequence[Bucket], seconds: float, now: float, span: float) -> list[Bucket]:
    """`seconds`-long buckets from the shorter ones ending in (now - span, now]: means weighted by
    time, sums of arrivals and errors, maxima of queue, p99 and KV (a conservative p99)."""
    groups: dict[int, list[Bucket]] = {}
    for b in buckets:
        if now - span < b.end <= now:
            groups.setdefault(math.ceil(b.end / seconds - 1e-9), []).append(b)
    out = []
    for key in sorted(groups):
        end = key * seconds
        load = aggregate(groups[key], end, seconds)  # the autoscaler's own averaging
        if load is None:
            continue
        out.append(
            Bucket(
                end=end,
                seconds=load.coverage * seconds,
                in_flight=load.in_flight,
                mu_per_minute=load.mu_per_minute,
                requests=load.requests,
                queue_depth=load.queue_depth,
                p99_latency_s=load.p99_latency_s,
                kv_cache_usage=load.kv_cache_usage,
                errors=load.errors,
                backlog_mu=load.backlog_mu,
                queued=load.queued,
                mu_squared_per_minute=load.mu_squared_per_minute,
            )
        )
    return out


@dataclass
class Apa(ScalingPolicy):
    """capacity.autoscaler in the loop, as the actuator would call it."""

    mu_per_replica_minute: float = MU_PER_REPLICA_MINUTE  # a replica's capacity, MU/min
    scale_to_zero: bool = False
    config: AutoscalerConfig = field(default_factory=AutoscalerConfig)
    name: str = "apa"
    last_vertical: float = -math.inf  # simulated seconds of the last vertical decision
    history: list[tuple[float, float]] = field(default_factory=list)  # (minute's end, MU/min)
    predicted_min: int = 0  # the forecast's floor, replicas; updated once a minute
    decisions: DecisionLog | None = None  # when a list, every horizontal decision goes there
    quiet_since: float | None = None  # the calm history's state (calm.quiet_since), carried
    judged_until: float = -math.inf  # simulated seconds of the last decision that judged it
    series: Series | None = None  # the series of bursts it is in (series.carried), carried

    def __post_init__(self) -> None:
        self.tick_s = self.config.tick_s

    def _forecast(self, buckets: Sequence[Bucket], now: float) -> None:
        """Once a minute: record the minute's MU/min and ask the forecast for a floor."""
        if self.history and now - self.history[-1][0] < 60.0:
            return
        minute = aggregate(buckets, now, 60.0)
        self.history.append((now, minute.mu_per_minute if minute else 0.0))
        self.predicted_min = predicted_min_replicas(
            self.history,
            now,
            self.mu_per_replica_minute,
            self.config.target_utilisation,
            lead_s=self.config.forecast_lead_s,
        )

    @property
    def history_s(self) -> float:  # type: ignore[override]
        first = calm.lookback_s(self.config, -math.inf, 0.0)  # the first judgement reads it all
        return max(ScalingPolicy.history_s, lookback_s(self.config) + 5, first + 5)

    def decide(self, state: FleetState, buckets: Sequence[Bucket], now: float) -> int:
        # The first judgement reads the warm-up's history, as if the passes had judged it all
        # along (the warm-up is decided by another policy).
        after = -math.inf if self.quiet_since is None else self.judged_until
        span = max(lookback_s(self.config), calm.lookback_s(self.config, after, now)) + 5
        if self.config.predictive_min:
            self._forecast(buckets, now)
        merged = Timeline(merge(buckets, 5.0, now, span))  # in order once, for the calm and the decider
        if calm.horizon_s(self.config) > 0:
            self.quiet_since = calm.quiet_since(self.quiet_since, merged, self.judged_until, now, self.config)
            self.judged_until = now
        self.series = carried(self.series, merged, now, self.config)
        spec = EndpointSpec(
            min_replicas=state.min_replicas,
            max_replicas=state.max_replicas,
            current_replicas=state.desired,
            target_concurrency_per_replica=state.target_concurrency,
            mu_per_replica_minute=self.mu_per_replica_minute,
            scale_to_zero_enabled=self.scale_to_zero,
            predicted_min_replicas=self.predicted_min,
            quiet_since=self.quiet_since,
            series_level=held(self.series, now, self.config),
            config=self.config,
        )
        decision = decide(spec, merged, now)
        if self.decisions is not None:
            load = aggregate(merged, now, self.config.scale_up_window_s)
            if load is not None:
                self.decisions.append(
                    (now, load.mu_per_minute, load.in_flight, load.queued, load.backlog_mu, decision)
                )
        return state.desired if decision.replicas is None else decision.replicas

    def concurrency(self, state: FleetState, buckets: Sequence[Bucket], now: float) -> int:
        if now - self.last_vertical < self.config.vertical_tick_s:
            return state.target_concurrency
        self.last_vertical = now
        recent = merge(buckets, 5.0, now, self.config.vertical_tick_s + 5)
        result = decide_concurrency(state.target_concurrency, state.ready, recent, now, self.config)
        return state.target_concurrency if result.target is None else result.target


@dataclass
class Hpa(ScalingPolicy):
    """Kubernetes HPA v2 on a Pods metric (in-flight per pod), real defaults; see the module doc."""

    target_per_pod: float = 70.0  # average in-flight requests per ready pod, > 0
    tolerance: float = 0.1  # --horizontal-pod-autoscaler-tolerance
    sync_s: float = 15.0  # --horizontal-pod-autoscaler-sync-period
    down_stabilisation_s: float = 300.0  # behavior.scaleDown.stabilizationWindowSeconds
    up_pods: int = 4  # behavior.scaleUp.policies: Pods 4 per 15 s ...
    up_percent: float = 100.0  # ... or Percent 100 per 15 s (selectPolicy Max)
    name: str = "hpa"
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)  # (time, replicas)

    def __post_init__(self) -> None:
        self.tick_s = self.sync_s

    def decide(self, state: FleetState, buckets: Sequence[Bucket], now: float) -> int:
        load = aggregate(buckets, now, self.sync_s)
        current = state.desired
        if load is None or state.ready == 0:
            return current  # no metrics from any pod: HPA leaves the scale alone
        ratio = (load.in_flight / state.ready) / self.target_per_pod
        # Worked numbers: 3 ready pods at 91 in flight each vs 70 -> ratio 1.3 -> ceil(3 x 1.3) = 4.
        raw = current if abs(ratio - 1.0) <= self.tolerance else math.ceil(ratio * state.ready)
        self.recommendations.append((now, raw))
        while self.recommendations and self.recommendations[0][0] <= now - self.down_stabilisation_s:
            self.recommendations.popleft()
        wanted = raw
        if raw < current:  # scale down only to the highest recommendation of the last 300 s
            wanted = min(current, max(r for _, r in self.recommendations))
        if wanted > current:
            cap = max(current + self.up_pods, math.floor(current * (1 + self.up_percent / 100)))
            wanted = min(wanted, cap)
        return self.clamp(state, wanted)


@dataclass
class Kpa(ScalingPolicy):
    """Knative's KPA, real defaults; see the module doc."""

    target_per_pod: float = 100.0 * 0.7  # container-concurrency-target-default x target-percentage
    stable_window_s: float = 60.0  # stable-window
    panic_window_s: float = 6.0  # panic-window-percentage 10 % of the stable window
    panic_threshold: float = 2.0  # panic-threshold-percentage 200 %
    max_scale_up_rate: float = 1000.0  # max-scale-up-rate
    max_scale_down_rate: float = 2.0  # max-scale-down-rate
    name: str = "kpa"
    panic_since: float | None = None  # simulated seconds of the last over-threshold tick
    max_panic_pods: int = 0  # the most pods asked for while panicking

    def __post_init__(self) -> None:
        self.tick_s = 2.0  # tick-interval

    def decide(self, state: FleetState, buckets: Sequence[Bucket], now: float) -> int:
        stable = aggregate(buckets, now, self.stable_window_s)
        panic = aggregate(buckets, now, self.panic_window_s)
        if stable is None or panic is None:
            return state.desired
        ready = max(1, state.ready)
        up_cap = math.ceil(self.max_scale_up_rate * ready)
        down_cap = math.floor(ready / self.max_scale_down_rate)
        # Every request in the system counts, those the router holds for a pod too (Knative's
        # activator reports the requests it buffers).
        stable_load, panic_load = stable.in_flight + stable.queued, panic.in_flight + panic.queued
        stable_pods = min(max(math.ceil(stable_load / self.target_per_pod), down_cap), up_cap)
        panic_pods = min(max(math.ceil(panic_load / self.target_per_pod), down_cap), up_cap)
        # Worked numbers: 2 ready pods, 300 in flight over 6 s -> 300 / 70 / 2 = 2.1 >= 2: panic.
        over = panic_load / self.target_per_pod / ready >= self.panic_threshold
        if over:
            self.panic_since = now
        elif self.panic_since is not None and self.panic_since + self.stable_window_s < now:
            self.panic_since, self.max_panic_pods = None, 0
        wanted = stable_pods
        if self.panic_since is not None:
            self.max_panic_pods = max(self.max_panic_pods, panic_pods)
            wanted = self.max_panic_pods
        return self.clamp(state, wanted)


@dataclass
class Schedule(ScalingPolicy):
    """Replicas from a per-minute schedule, asked for `lead_s` ahead: the oracle, or static."""

    per_minute: Sequence[int] = ()  # replicas each minute needs, from minute 0
    lead_s: float = 30.0  # the pod start time: minute m's replicas are asked for at 60 m - lead
    offset_s: float = 0.0  # where minute 0 starts, seconds (after a warm-up mirroring its start)
    name: str = "oracle"

    def __post_init__(self) -> None:
        self.tick_s = 1.0

    def _minute(self, t: float) -> int:
        """The schedule's minute at simulated time t. The warm-up replays the first minutes
        mirrored (fleet.warmup_time): time offset - 10 s plays minute 0's arrivals. Worked
        numbers, offset 300 s: t 250 s -> minute 0, t 170 s -> minute 2, t 310 s -> minute 0."""
        at = t - self.offset_s if t >= self.offset_s else self.offset_s - t
        return min(int(at // 60), len(self.per_minute) - 1)

    def wanted(self, now: float) -> int:
        """The most of the minute now and the minute `lead_s` ahead (so pods are ready in time,
        and the current minute keeps its replicas until it ends). Worked numbers: schedule
        [3, 9], pod start 30 s -> 3 until 0:30, then 9 (ready at 1:00, when minute 1 starts)."""
        if not self.per_minute:
            return 0
        return max(self.per_minute[self._minute(now)], self.per_minute[self._minute(now + self.lead_s)])

    def decide(self, state: FleetState, buckets: Sequence[Bucket], now: float) -> int:
        return self.clamp(state, self.wanted(now))
