"""The fleet simulator: replay a trace of arrivals (with token counts) against a fleet of
simulated replicas under a scaling policy, and measure GPU-hours and SLO attainment. Pure Python,
simulated time. Replicas follow the simulated engine's continuous-batching model
(`dataplane.runtime.perf_model`: one model, two drivers); the router balances by power of two
choices on in-flight MU under each replica's concurrency limit; the policy (`apa` = our
`capacity.autoscaler`, `hpa`, `kpa`, the clairvoyant `oracle`, `static-peak`) decides replicas
that start after a pod start time and drain when removed.

    python -m capacity.simulate --trace /work/shared/data/azure-llm-2023-conv.csv --policy apa \\
        --amplify 20 --json
"""

from capacity.simulate.fleet import FleetConfig, MinuteStats, Result, run
from capacity.simulate.scenario import POLICIES, simulate

__all__ = ["POLICIES", "FleetConfig", "MinuteStats", "Result", "run", "simulate"]
