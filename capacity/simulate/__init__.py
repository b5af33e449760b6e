"""The fleet simulator: replay a trace of arrivals (with token counts) against a fleet of
simulated replicas under a scaling policy, and measure GPU-hours and SLO attainment. Pure Python,
simulated time. Replicas follow the simulated engine's continuous-batching model
(`dataplane.runtime.perf_model`: one model, two drivers); the router balances by power of two
choices on in-flight MU under each replica's concurrency limit; the policy (`apa` = our
`capacity.autoscaler`, `hpa`, `kpa`, the clairvoyant `oracle`, `static-peak`) decides replicas
that start after a pod start time and drain when removed.

    python -m capacity.simulate --trace /work/shared/data/azure-llm-2023-conv.csv --policy apa \\
        --amplify 20 --json

Modules: `traces` (CSV load, amplify, time-scale, synthetic generators), `replica` (one
engine), `sizing` (MU price and the oracle's schedule), `policies`, `fleet` (router + loop),
`scenario` (`simulate(profile, trace, policy)`). Nothing is imported here, so that
`python -m capacity.simulate.traces` runs its module once.
"""
