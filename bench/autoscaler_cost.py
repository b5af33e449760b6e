"""CPU cost of one horizontal decision pass over N endpoints (goal: 10,000 under 1 s).

    .venv/bin/python bench/autoscaler_cost.py

Each endpoint brings five minutes of 5-second buckets (60 buckets, about the 350 s the decider
reads by default: what a collector keeps); the pass decides every endpoint once. Prints CPU
seconds per pass and per endpoint as N grows; then the same with a calm history of 30 minutes
(`calm_history_s` 1800, opt-in), each endpoint bringing the 36 minutes that judgement reads.
"""

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from capacity.autoscaler import AutoscalerConfig, Bucket, EndpointSpec, decide
from capacity.autoscaler.horizontal import lookback_s

NOW = 1_000_000.0


def fleet(n: int, rng: random.Random, config: AutoscalerConfig | None = None):
    config = config or AutoscalerConfig()
    count = max(60, int(lookback_s(config) // 5) + 1)
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
            config=config,
        )
        out.append((spec, buckets))
    return out


def main() -> None:
    rng = random.Random(5)
    calm = AutoscalerConfig(calm_history_s=1800.0)
    print(f"{'endpoints':>10} {'cpu s/pass':>11} {'us/endpoint':>12}  goal: 10,000 under 1 s")
    for n, config in [(n, None) for n in (1_000, 5_000, 10_000, 20_000)] + [(1_000, calm), (10_000, calm)]:
        if config is calm and n == 1_000:
            print("with a calm history of 1800 s (every endpoint opted in):")
        endpoints = fleet(n, rng, config)
        started = time.process_time()
        changed = sum(
            1 for spec, buckets in endpoints if decide(spec, buckets, NOW).changes(spec.current_replicas)
        )
        cpu = time.process_time() - started
        verdict = ("met" if cpu < 1 else "MISSED") if n == 10_000 else ""
        print(f"{n:>10} {cpu:>11.3f} {cpu / n * 1e6:>12.1f}  {verdict} ({changed} would change)")


if __name__ == "__main__":
    main()
