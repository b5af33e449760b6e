"""CPU cost of one horizontal decision pass over N endpoints (goal: 10,000 under 1 s).

    .venv/bin/python bench/autoscaler_cost.py [--smoke]

Each endpoint brings five minutes of 5-second buckets (60 buckets, about the 350 s the decider
reads by default: what a collector keeps); the pass decides every endpoint once. Prints CPU
seconds per pass and per endpoint as N grows, each endpoint's calm judged on the spans since
the last pass (the state the pass keeps, `calm.quiet_since`, for the quiet margin that is on by
default) and its series of bursts carried (`series.carried`), so each endpoint brings the same
buckets; then with an operator's calm history of 30 minutes (`calm_history_s` 1800) too, with
neither (`quiet_margin` 1: no judgement), and with every endpoint bursting in a series whose
row holds the most bursts kept (`bursting`).
--smoke: the same rows at 10 and 50 endpoints, in a second.
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dataclasses import replace

from capacity.autoscaler import AutoscalerConfig, Bucket, EndpointSpec, Timeline, calm, decide, series
from capacity.autoscaler.horizontal import lookback_s

NOW = 1_000_000.0
BURSTING = AutoscalerConfig()  # the defaults, on bursting endpoints (`bursting`)


def fleet(n: int, rng: random.Random, config: AutoscalerConfig | None = None):
    """N endpoints and the buckets a pass brings each, calm for an hour where that is judged."""
    config = config or AutoscalerConfig()
    count = max(60, int(max(lookback_s(config), calm.lookback_s(config, NOW - 5, NOW)) // 5) + 1)
    out = []
    for _ in range(n):
        base = rng.uniform(10, 2000)
        buckets = [
            Bucket(
                NOW - 5 * count + 5 * (i + 1),
                5,
                base / 50 * rng.uniform(0.5, 1.5),
                base * rng.uniform(0.5, 1.5),
                20,
            )
            for i in range(count)
        ]
        spec = EndpointSpec(
            min_replicas=1,
            max_replicas=200,
            current_replicas=rng.randint(1, 40),
            target_concurrency_per_replica=8,
            quiet_since=NOW - 3600.0,
            config=config,
        )
        out.append((spec, buckets))
    return out


def bursting(endpoints: list, rng: random.Random) -> list:
    """The same fleet with every endpoint in a series of bursts (20-s bursts at 7x every 50 s)
    that the pass carries with the most bursts it keeps, stored as rows (the worst case)."""
    out = []
    for spec, buckets in endpoints:
        phase = rng.uniform(0, 50)
        raised = [
            replace(b, mu_per_minute=b.mu_per_minute * 7) if (b.end - phase) % 50 < 20 else b for b in buckets
        ]
        kept = [[NOW - 3600 + 50 * i, NOW - 3580 + 50 * i, 1000.0] for i in range(series.KEPT_RUNS)]
        out.append((spec, raised, kept))
    return out


def judged_and_decided(spec: EndpointSpec, buckets: list[Bucket], stored: list | None = None) -> bool:
    """The pass's work for one endpoint: its calm history judged and its series of bursts
    carried (read from and written back to its row's form), then its decision."""
    cfg = spec.config
    timeline = Timeline(buckets)  # as the pass: in order once, for all three
    quiet_since = spec.quiet_since
    if calm.horizon_s(cfg) > 0:
        quiet_since = calm.quiet_since(quiet_since, timeline, NOW - 5, NOW, cfg)
    previous = series.Series.of_rows(stored) if stored else None
    carried = series.carried(previous, timeline, NOW, cfg)
    if carried is not None:
        json.dumps(carried.rows())
    # one spec, as the pass makes
    spec = replace(spec, quiet_since=quiet_since, series_level=series.held(carried, NOW, cfg))
    return decide(spec, timeline, NOW).changes(spec.current_replicas)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: 10 and 50 endpoints")
    args = parser.parse_args()
    sizes, compared = (
        ((10, 50), (10, 50)) if args.smoke else ((1_000, 5_000, 10_000, 20_000), (1_000, 10_000))
    )
    rng = random.Random(5)
    with_calm = AutoscalerConfig(calm_history_s=1800.0)
    unjudged = AutoscalerConfig(quiet_margin=1.0)
    print(f"{'endpoints':>10} {'cpu s/pass':>11} {'us/endpoint':>12}  goal: 10,000 under 1 s")
    runs = [(n, None) for n in sizes]
    runs += [(n, c) for c in (with_calm, unjudged, BURSTING) for n in compared]
    for n, config in runs:
        if config is with_calm and n == compared[0]:
            print("with a calm history of 1800 s too:")
        if config is unjudged and n == compared[0]:
            print("with neither (quiet_margin 1), nothing judged:")
        if config is BURSTING and n == compared[0]:
            print(f"every endpoint in a series of bursts, {series.KEPT_RUNS} carried (the worst case):")
        if config is BURSTING:
            endpoints = bursting(fleet(n, rng), rng)
        else:
            endpoints = [(spec, buckets, None) for spec, buckets in fleet(n, rng, config)]
        started = time.process_time()
        changed = sum(1 for spec, buckets, stored in endpoints if judged_and_decided(spec, buckets, stored))
        cpu = time.process_time() - started
        verdict = ("met" if cpu < 1 else "MISSED") if n == 10_000 else ""
        print(f"{n:>10} {cpu:>11.3f} {cpu / n * 1e6:>12.1f}  {verdict} ({changed} would change)")


if __name__ == "__main__":
    main()
