"""python -m capacity.simulate --trace PATH --policy NAME [--amplify X] [--time-scale X] [--json]

Prints a readable summary, or with --json one JSON object on the last line: gpu_hours,
static_peak_gpu_hours, slo_attainment, p99_latency_s, rejected_fraction, scale_events and more
(--minutes adds the per-minute series; --compare-oracle also runs the oracle for the ratio).

The replayed deployment's context is `--max-model-len` (default 131,072: Llama 3.1's own 128k;
the profile's 8,192 is what the live demo deploys with), bounded by the profile's KV cache: a
trace with a prompt that leaves no room for one output token in it is refused, naming the row's
prompt and the limit; a prompt + answer past it keeps its prompt and loses the answer's tail.
Its chunk of prefill per step is the largest within the SLO's inter-token deadline
(`sizing.chunk_within_itl`: 2,048 tokens on h100-llama-8b, not the profile's 8,192).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

from capacity.autoscaler import AutoscalerConfig
from capacity.simulate.fleet import FleetConfig, Result
from capacity.simulate.scenario import (
    POLICIES,
    attainment_without,
    causal_floor,
    minute_bounds,
    searched_oracle,
    simulate,
)
from capacity.simulate.sizing import deployed
from capacity.simulate.traces import Trace, TraceError, amplify, load, time_scale
from engine_model.perf_model import EngineProfile
from engine_model.profiles import get_profile

CONTEXT_TOKENS = 131_072  # the default --max-model-len: Llama 3.1's context


def with_context(profile: EngineProfile, max_model_len: int) -> EngineProfile:
    """The profile deployed with `--max-model-len`; beyond its KV cache it could not start."""
    if not 1 < max_model_len <= profile.kv_capacity_tokens:
        raise ValueError(
            f"--max-model-len {max_model_len} must be in [2, {profile.kv_capacity_tokens}]"
            f" (profile {profile.name}'s KV cache holds {profile.kv_capacity_tokens} tokens)"
        )
    return replace(profile, max_model_len=max_model_len)


def check_context(trace: Trace, profile: EngineProfile) -> None:
    """Refuse a trace whose longest prompt leaves no room for one output token."""
    longest = max(trace.prompts, default=0)
    if longest > profile.max_model_len - 1:
        at = trace.prompts.index(longest)
        raise ValueError(
            f"a prompt of {longest} tokens (arrival {at + 1}, at {trace.times[at]:.3f} s) leaves no"
            f" room for one answer token in the context length {profile.max_model_len} of profile"
            f" {profile.name} (--max-model-len)"
        )


def summary(result: Result, oracle: Result | None = None) -> dict[str, Any]:
    out = {k: v for k, v in asdict(result).items() if k != "minutes"}
    out["violating_minutes"] = list(result.violating_minutes)
    if oracle is not None:
        out["oracle_gpu_hours"] = oracle.gpu_hours
        out["oracle_ratio"] = result.gpu_hours / oracle.gpu_hours if oracle.gpu_hours else None
    out["static_peak_ratio"] = (
        result.gpu_hours / result.static_peak_gpu_hours if result.static_peak_gpu_hours else None
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m capacity.simulate", description=__doc__)
    parser.add_argument("--trace", required=True, help="CSV: TIMESTAMP,ContextTokens,GeneratedTokens")
    parser.add_argument("--policy", required=True, choices=POLICIES, help="the autoscaling policy to replay")
    parser.add_argument("--amplify", type=float, default=1.0, help="replay each arrival X times (X<1 thins)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="compress time X times")
    parser.add_argument("--profile", default="h100-llama-8b", help="the engine profile a replica runs")
    parser.add_argument(
        "--max-model-len", type=int, default=CONTEXT_TOKENS, help="the deployment's context, tokens"
    )
    parser.add_argument(
        "--long-prefill-token-threshold",
        type=int,
        default=0,
        help="vLLM's: most prompt tokens one request prefills a step beside others (0: no cap)",
    )
    parser.add_argument("--pod-start", type=float, default=30.0, help="seconds from ask to ready")
    parser.add_argument("--min-replicas", type=int, default=1, help="0 allows scale to zero")
    parser.add_argument(
        "--max-replicas", type=int, default=5000, help="the most replicas any policy may ask for"
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the replicas' simulated timings")
    parser.add_argument(
        "--oracle-margin",
        type=float,
        default=0.9,
        help="the oracle sizes each minute at this share of a replica's capacity at the SLO (0 < x <= 1)",
    )
    parser.add_argument(
        "--compare-oracle", action="store_true", help="also run the oracle; adds oracle_ratio"
    )
    parser.add_argument(
        "--search-oracle",
        action="store_true",
        help="search the oracle's schedule by replaying it (slower); adds unmet_minutes,"
        " slo_attainment_meetable (without the minutes no searched schedule met) and"
        " oracle_bound_gpu_hours (what no per-minute schedule goes below) and"
        " causal_floor_gpu_hours (what no policy that sees a burst only when it comes goes below"
        " meeting every minute, if the trace's bursts may start at any 10 s of its middle 80 %%)",
    )
    parser.add_argument("--minutes", action="store_true", help="add the per-minute series to --json")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    try:
        trace = load(args.trace)
        if args.time_scale != 1.0:
            trace = time_scale(trace, args.time_scale)
        if args.amplify != 1.0:
            trace = amplify(trace, args.amplify, seed=args.seed)
        profile = with_context(get_profile(args.profile), args.max_model_len)
        check_context(trace, profile)
        fleet = FleetConfig(
            pod_start_s=args.pod_start,
            min_replicas=args.min_replicas,
            max_replicas=args.max_replicas,
            initial_replicas=args.min_replicas,
            seed=args.seed,
        )
        profile = deployed(profile, fleet.slo_per_output_token_s, args.long_prefill_token_threshold)
        apa = AutoscalerConfig()
        searched = bound = floor = None
        if args.search_oracle and (args.policy == "oracle" or args.compare_oracle):
            searched = searched_oracle(profile, trace, fleet, apa, args.oracle_margin)
            bounds = minute_bounds(profile, trace, searched.per_minute, fleet, apa)
            bound = bounds.gpu_hours(fleet)
            floor = causal_floor(profile, trace, bounds, fleet, apa).gpu_hours(fleet)
        if args.policy == "oracle" and searched is not None:
            result = searched.result
        else:
            result = simulate(profile, trace, args.policy, fleet, apa, args.oracle_margin)
        oracle = None
        if args.compare_oracle and args.policy != "oracle":
            oracle = (
                searched.result
                if searched
                else simulate(profile, trace, "oracle", fleet, apa, args.oracle_margin)
            )
    except (TraceError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = summary(result, oracle if oracle is not None else (result if args.policy == "oracle" else None))
    if searched is not None:
        out["unmet_minutes"] = list(searched.unmet)
        out["slo_attainment_meetable"] = attainment_without(result, searched.unmet)
        out["oracle_bound_gpu_hours"] = bound
        out["causal_floor_gpu_hours"] = floor
    if args.minutes:
        out["minutes"] = [asdict(m) for m in result.minutes]
    if args.json:
        print(json.dumps(out, default=str))
        return 0
    minutes = result.duration_s / 60
    print(f"policy {result.policy} on {args.trace} ({result.requests} requests, {minutes:.0f} min)")
    for key in (
        "gpu_hours",
        "static_peak_gpu_hours",
        "oracle_ratio",
        "static_peak_ratio",
        "slo_attainment",
        "p99_latency_s",
        "p99_slo_ratio",
        "rejected_fraction",
        "scale_events",
        "mean_replicas",
        "peak_replicas",
    ):
        if key in out and out[key] is not None:
            value = out[key]
            print(f"  {key:22} {value:.4g}" if isinstance(value, float) else f"  {key:22} {value}")
    print(f"  violating minutes      {list(result.violating_minutes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
