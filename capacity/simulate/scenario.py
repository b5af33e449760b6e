"""One simulation from names: a profile, a trace, a policy; the oracle and static peak sized from
the trace. Pure. The CLI and the bench both go through `simulate`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from capacity.autoscaler import AutoscalerConfig
from capacity.simulate.arrivals import Arrival
from capacity.simulate.fleet import FleetConfig, Result, run
from capacity.simulate.policies import Apa, Hpa, Kpa, ScalingPolicy, Schedule
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


def simulate(
    profile: EngineProfile,
    trace: Sequence[Arrival],
    policy: str,
    fleet: FleetConfig | None = None,
    apa_config: AutoscalerConfig | None = None,
    oracle_margin: float = 0.9,
    warmup_s: float = 300.0,
) -> Result:
    """Run `policy` on `trace`. Every policy starts warm at the oracle's first-minute replicas
    (static-peak at its peak) and with `warmup_s` of history (the trace's first minutes played
    once before it, unmeasured, under the oracle), so the comparison is about following load,
    not a cold start."""
    if not trace:
        raise ValueError("the trace is empty")
    fleet = fleet or FleetConfig()
    apa_config = apa_config or AutoscalerConfig()
    # A replica's capacity at the SLO, as the capacity benchmark would publish it: apa's
    # mu_per_replica_minute and the oracle's unit. hpa and kpa keep their own defaults.
    batch = full_batch(profile, trace)  # one pass over the trace for all three below
    capacity = slo_capacity_mu_per_s(
        profile, trace, fleet.slo_first_token_s, fleet.slo_per_output_token_s, batch=batch
    )
    schedule = oracle_schedule(profile, trace, capacity, margin=oracle_margin, batch=batch)
    peak = max(schedule)
    first = max(schedule[0], fleet.min_replicas, 1)
    start = peak if policy == "static-peak" else first
    fleet = replace(fleet, initial_replicas=min(max(start, fleet.min_replicas), fleet.max_replicas))
    if policy in UNLIMITED and not fleet.target_concurrency:
        fleet = replace(fleet, target_concurrency=NO_LIMIT)
    chosen = make_policy(policy, schedule, fleet, apa_config, warmup_s, capacity * 60.0)
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
