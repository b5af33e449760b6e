"""python -m capacity.simulate --trace PATH --policy NAME [--amplify X] [--time-scale X] [--json]

Prints a readable summary, or with --json one JSON object on the last line: gpu_hours,
static_peak_gpu_hours, slo_attainment, p99_latency_s, rejected_fraction, scale_events and more
(--minutes adds the per-minute series; --compare-oracle also runs the oracle for the ratio).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from capacity.autoscaler import AutoscalerConfig
from capacity.simulate.fleet import FleetConfig, Result
from capacity.simulate.scenario import POLICIES, simulate
from capacity.simulate.traces import TraceError, amplify, load, time_scale
from dataplane.runtime.profiles import get_profile


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
    parser.add_argument("--policy", required=True, choices=POLICIES)
    parser.add_argument("--amplify", type=float, default=1.0, help="replay each arrival X times (X<1 thins)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="compress time X times")
    parser.add_argument("--profile", default="h100-llama-8b")
    parser.add_argument("--pod-start", type=float, default=30.0, help="seconds from ask to ready")
    parser.add_argument("--min-replicas", type=int, default=1, help="0 allows scale to zero")
    parser.add_argument("--max-replicas", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--oracle-margin", type=float, default=0.9)
    parser.add_argument(
        "--compare-oracle", action="store_true", help="also run the oracle; adds oracle_ratio"
    )
    parser.add_argument("--minutes", action="store_true", help="add the per-minute series to --json")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        trace = load(args.trace)
        if args.time_scale != 1.0:
            trace = time_scale(trace, args.time_scale)
        if args.amplify != 1.0:
            trace = amplify(trace, args.amplify, seed=args.seed)
        profile = get_profile(args.profile)
        fleet = FleetConfig(
            pod_start_s=args.pod_start,
            min_replicas=args.min_replicas,
            max_replicas=args.max_replicas,
            initial_replicas=args.min_replicas,
            seed=args.seed,
        )
        apa = AutoscalerConfig()
        result = simulate(profile, trace, args.policy, fleet, apa, args.oracle_margin)
        oracle = None
        if args.compare_oracle and args.policy != "oracle":
            oracle = simulate(profile, trace, "oracle", fleet, apa, args.oracle_margin)
    except (TraceError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = summary(result, oracle if oracle is not None else (result if args.policy == "oracle" else None))
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
