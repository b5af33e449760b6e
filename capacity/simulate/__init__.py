"""The fleet simulator: replay a trace of arrivals (with token counts) against a fleet of
simulated replicas under a scaling policy, and measure GPU-hours and SLO attainment. Pure Python,
simulated time. Replicas follow the simulated engine's continuous-batching model
(`engine_model.perf_model`: one model, two drivers); the router balances by power of two
choices on in-flight MU under each replica's concurrency limit; the policy (`apa` = our
`capacity.autoscaler`, `hpa`, `kpa`, the clairvoyant `oracle`, `static-peak`) decides replicas
that start after a pod start time and drain when removed.

    python -m capacity.simulate --trace /work/shared/data/azure-llm-2023-conv.csv --policy apa \\
        --amplify 20 --json

Modules: `traces` (CSV load, amplify, time-scale, the kinds of synthetic trace), `arrivals`
(the columnar `Trace` and the seeded arrival process), `replica` (one engine), `sizing` (MU
price and the oracle's schedule), `policies`, `fleet` (router + loop), `percentiles` (the run's
p99s in bounded memory), `scenario` (`simulate(profile, trace, policy)`). Nothing is imported
here, so that `python -m capacity.simulate.traces` runs its module once. `make sim-native`
compiles the hot modules with mypyc (2-3x faster; `scripts/sim-native.sh` runs a command on
them): a day of ~200 replicas, 115M requests, takes ~11 CPU-minutes that way, ~29 in Python.
"""
