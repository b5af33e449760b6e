"""Benchmarks: measure what an engine sustains per request shape, to price its model in model units.

Pure and async (no Django, DRF, Celery or controlplane): a sweep drives any OpenAI-compatible
engine URL (vLLM, or the simulated engine) or the simulated performance model in-process, and
finds for each shape (input tokens, output tokens) the highest request rate that meets the
latency SLO; capacity.fitting turns those rates into alpha, beta and gamma.

    config.py   what to measure and against which objective: DEFAULT_SHAPES, Slo, SweepConfig
    results.py  what a sweep records: Step, ShapeResult, SweepResult; BenchmarkError when the
                engine fails
    drivers.py  how a sweep talks to an engine: the Driver protocol, HttpDriver (and connect,
                which builds one from a URL), SimulatedDriver
    sweep.py    the sweep: the closed-loop climb, the open loop, re-measures and second looks
    checks.py   plausibility of a sweep's rates, pure: implausible, slow_outliers,
                slowest_first, at_least_larger
    report.py   the sweep as text: table, summary
"""
