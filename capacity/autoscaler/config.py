"""Every autoscaler parameter, its default, its unit and its valid range, in one place.

Defaults follow the anchors (Kubernetes HPA's tolerance 0.1, Knative's 60 s stable window)
unless a comment says otherwise; the reasons for the others are in `horizontal`'s docstring and
were measured with the fleet simulator (`bench/autoscaler_policies.py`). Per-endpoint overrides go
through `AutoscalerConfig.from_overrides`, which refuses an unknown key or a bad value naming both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class AutoscalerConfig:
    # --- horizontal: replicas, every tick_s ----------------------------------------------------
    tick_s: float = 5.0  # seconds between horizontal decisions; > 0
    # Share of a replica's capacity to plan for; (0, 1]. 0.8, not Knative's 0.7: the capacity
    # (mu_per_replica_minute) is already the benchmark's sustainable rate at the latency SLO.
    target_utilisation: float = 0.8
    scale_up_window_s: float = 20.0  # seconds of traffic a scale-up looks at; > 0
    # The MU need of a window is its busiest span this long (a sliding sum of buckets), not its
    # mean: what a replica must absorb without saturating its prefill (see horizontal); > 0; a
    # scale-up window shorter than this is read whole. The oracle sizes on its busiest 10 s too.
    peak_window_s: float = 10.0
    # A scale-down follows the highest MU need of this long; >= up window. Knative's stable
    # window; HPA's 300 s suits a controller that takes minutes to scale back up (see horizontal).
    scale_down_window_s: float = 60.0
    # Past the scale-down window and up to this age, seconds, a burst still holds the capacity
    # that would serve a recurrence of it before new pods are ready (horizontal.burst_hold), at
    # most burst_hold_cap x the current need: recurring bursts land on standing capacity. 0 (or
    # <= scale_down_window_s) is off; >= 0. HPA's stabilisation is 300 s.
    burst_memory_s: float = 300.0
    # The wait a recurring burst's requests may take for a first token, seconds: the hold serves
    # what arrives in any span up to pod_start_s within that span plus this. The TTFT SLO's 5 s
    # of queueing (capacity.simulate.fleet); > 0.
    burst_wait_s: float = 5.0
    # The hold is at most this x the current need, replicas: a 20x burst is not kept standing
    # for minutes (uncapped, the hold cost 1.4-2.1x the GPU-hours on bursty mixes in the fleet
    # simulator; at 1.5 it met no minute more on seeds 1-2; docs/autoscaler.md), unless bursts
    # recur in a series (burst_recurrence_s); >= 1.
    burst_hold_cap: float = 1.75
    # Bursts recur when three or more (of 10 s or more) within burst_memory_s came under this
    # apart on average, seconds, the last under eight times that mean ago: then the hold keeps,
    # past its cap, what the series' tallest burst needed, and replicas are planned at
    # recurring_utilisation at least (above a lower target_utilisation too: the held fleet is
    # the margin) (series.recurring); a series of one level that goes on for burst_memory_s is
    # carried past it until burst_memory_s pass without a burst (series.carried). 0 is off;
    # >= 0. 60 (a minute, what the SLO is judged over), in the fleet simulator over seeds 1-8,
    # against 0: where bursts of 4-7x come in series, 6-11 % fewer GPU-hours and 0.02-0.09 more
    # of the minutes; on tall bursts minutes apart, 0-2 % more; on the prefill mixes' seeds 1-2,
    # 1-2 % fewer (docs/evaluation/autoscaler.md).
    burst_recurrence_s: float = 60.0
    recurring_utilisation: float = 1.0  # ... the least share of a replica planned for then; (0, 1]
    # Seconds of calm that let the decider drop its margins for bursts (capacity.autoscaler.calm):
    # no 10-s span above burst_ratio x the mean of the 300 s before it for this long, and there it
    # plans at a full replica, holds no burst and scales up without the band. 0 is off (the
    # default: a bursty endpoint's first burst after a calm spell loses its minute;
    # docs/evaluation/autoscaler.md); >= 0.
    calm_history_s: float = 0.0
    # ... and only where the work arriving within burst_wait_s varies by at most this (its
    # coefficient of variation were arrivals Poisson with the scale-down window's request sizes,
    # calm.work_spread): planned at a full replica, a lump of long prompts (42k-126k tokens,
    # seconds of prefill each) holds every replica's first tokens. The Azure hour reads 0.04,
    # long contexts 0.27 (docs/evaluation/autoscaler.md); >= 0.
    calm_max_spread: float = 0.1
    # Once no burst came for quiet_after_s (the same judgement), plan keeping only this share of
    # the margin (1 - target_utilisation): 0.5 plans for 0.9 of a replica at the default 0.8, so
    # what is left is the tolerance band; a burst restores the whole margin at once. 1 keeps it
    # always (off); [0, 1]. In the fleet simulator (docs/autoscaler.md): 8-13 % fewer GPU-hours on
    # the Azure hour and long contexts for 1 of 360 long-context minutes, every surge of up to
    # 2x still met; the bursty mixes never go 30 minutes without a burst and are unchanged.
    quiet_margin: float = 0.5
    # Seconds without a burst before quiet_margin applies; > 0. Decode-heavy fan-outs come
    # minutes apart: at 300 s the margin was gone when the next came (4 minutes lost on 8 seeds).
    quiet_after_s: float = 1800.0
    # A span this many times the 300 s before it is a burst; > 1. The simulator's mixes reach
    # 1.4-1.8 on smooth traffic (the Azure hour, 85k-token prompts) and 4-35 in bursts.
    burst_ratio: float = 2.5
    tolerance: float = 0.1  # no change while need / current is within 1 +- this; [0, 1)
    # Per tick at most current x this ...; >= 1. Knative allows 1000; 10 reaches a 10,000 QPS
    # ramp as fast (the simulator: 6 % rejected instead of 11 % at 2) and still keeps a broken
    # meter from asking thousands of replicas in one tick.
    max_scale_up_factor: float = 10.0
    max_scale_up_step: int = 4  # ... or current + this, whichever is larger (from 0: this many); >= 1
    scale_to_zero_grace_s: float = 300.0  # idle this long before zero replicas (when allowed); >= 0
    min_coverage: float = 0.5  # share of a window the samples must cover, else no decision; (0, 1]
    # Plan to drain the router's backlog (Bucket.backlog_mu) in this long, seconds; > 0. About a
    # pod start: capacity asked now serves ~30 s later, and clients give up after ~60 s of waiting.
    backlog_drain_s: float = 30.0
    # Ask -> ready of a new replica that the burst hold plans for, seconds; >= 0 (image pull,
    # model load).
    pod_start_s: float = 30.0
    # --- vertical: target concurrency per replica, every vertical_tick_s --------------------
    vertical_tick_s: float = 30.0  # seconds between vertical decisions; and the window it reads; > 0
    latency_slo_s: float = 10.0  # p99 end-to-end latency objective, seconds; > 0
    latency_high: float = 0.9  # p99 above this share of the SLO is overload; (0, 10]
    latency_low: float = 0.5  # p99 below this share of the SLO leaves room to grow; < latency_high
    kv_cache_high: float = 0.9  # KV-cache usage above this is overload; (0, 1]
    kv_cache_low: float = 0.7  # KV-cache usage below this leaves room to grow; < kv_cache_high
    queue_high_per_replica: float = 1.0  # waiting requests per replica above this is overload; >= 0
    busy_utilisation: float = 0.8  # grow only when replicas use this share of their target; (0, 1]
    shrink_factor: float = 0.75  # on overload the target becomes target x this (at least -1); (0, 1)
    grow_fraction: float = 0.1  # with room the target grows by this share (at least +1); > 0
    min_target_concurrency: int = 1  # >= 1
    max_target_concurrency: int = 256  # >= min_target_concurrency
    # --- predictive minimum (off by default) --------------------------------------------------
    predictive_min: bool = False  # raise the minimum ahead of a recurring daily/weekly peak
    forecast_lead_s: float = 300.0  # how far ahead to provision for a predicted peak; >= 0

    def __post_init__(self) -> None:
        checks = [
            ("tick_s", self.tick_s > 0),
            ("target_utilisation", 0 < self.target_utilisation <= 1),
            ("scale_up_window_s", self.scale_up_window_s > 0),
            ("scale_down_window_s", self.scale_down_window_s >= self.scale_up_window_s),
            ("peak_window_s", self.peak_window_s > 0),
            ("burst_memory_s", self.burst_memory_s >= 0),
            ("burst_wait_s", self.burst_wait_s > 0),
            ("burst_hold_cap", self.burst_hold_cap >= 1),
            ("burst_recurrence_s", self.burst_recurrence_s >= 0),
            ("recurring_utilisation", 0 < self.recurring_utilisation <= 1),
            ("calm_history_s", self.calm_history_s >= 0),
            ("calm_max_spread", self.calm_max_spread >= 0),
            ("quiet_margin", 0 <= self.quiet_margin <= 1),
            ("quiet_after_s", self.quiet_after_s > 0),
            ("burst_ratio", self.burst_ratio > 1),
            ("tolerance", 0 <= self.tolerance < 1),
            ("max_scale_up_factor", self.max_scale_up_factor >= 1),
            ("max_scale_up_step", self.max_scale_up_step >= 1),
            ("scale_to_zero_grace_s", self.scale_to_zero_grace_s >= 0),
            ("min_coverage", 0 < self.min_coverage <= 1),
            ("backlog_drain_s", self.backlog_drain_s > 0),
            ("pod_start_s", self.pod_start_s >= 0),
            ("vertical_tick_s", self.vertical_tick_s > 0),
            ("latency_slo_s", self.latency_slo_s > 0),
            ("latency_high", 0 < self.latency_high <= 10),
            ("latency_low", 0 < self.latency_low < self.latency_high),
            ("kv_cache_high", 0 < self.kv_cache_high <= 1),
            ("kv_cache_low", 0 < self.kv_cache_low < self.kv_cache_high),
            ("queue_high_per_replica", self.queue_high_per_replica >= 0),
            ("busy_utilisation", 0 < self.busy_utilisation <= 1),
            ("shrink_factor", 0 < self.shrink_factor < 1),
            ("grow_fraction", self.grow_fraction > 0),
            ("min_target_concurrency", self.min_target_concurrency >= 1),
            ("max_target_concurrency", self.max_target_concurrency >= self.min_target_concurrency),
            ("forecast_lead_s", self.forecast_lead_s >= 0),
        ]
        for key, ok in checks:
            value = getattr(self, key)
            if isinstance(value, float) and not math.isfinite(value):
                ok = False
            if not ok:
                raise ValueError(f"autoscaler setting {key}={value!r} is out of range (see AutoscalerConfig)")

    @classmethod
    def from_overrides(
        cls, overrides: Mapping[str, Any], base: AutoscalerConfig | None = None
    ) -> AutoscalerConfig:
        """A config with some keys overridden: {"target_utilisation": 0.6}; refuses what is wrong."""
        base = base or cls()
        types = {f.name: f.type for f in fields(cls)}
        clean: dict[str, Any] = {}
        for key, value in overrides.items():
            if key not in types:
                raise ValueError(f"unknown autoscaler setting {key!r} (known: {', '.join(sorted(types))})")
            expected = types[key]
            if expected == "bool":
                if not isinstance(value, bool):
                    raise ValueError(f"autoscaler setting {key}={value!r} must be true or false")
            elif expected == "int":
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"autoscaler setting {key}={value!r} must be an integer")
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"autoscaler setting {key}={value!r} must be a number")
            if expected == "float":
                try:
                    value = float(value)
                except OverflowError:  # an integer past a float's range: out of range, not a 500
                    raise ValueError(f"autoscaler setting {key}={value!r} is out of range") from None
            clean[key] = value
        return replace(base, **clean)
