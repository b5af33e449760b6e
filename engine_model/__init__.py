"""The inference engine's performance model: what one engine step costs and how its scheduler
fills it (``perf_model``), the named simulated-engine profiles (``profiles``) and what an
image costs (``vision``). Pure: no I/O, no clock.

One model, two drivers: the data plane's simulated engine (dataplane.runtime.sim) steps it in
real time, the fleet simulator and the benchmark's drivers (capacity.simulate,
capacity.benchmark) in simulated time. It imports nothing of ours but capacity.units, and no
Django (tests/test_boundaries.py).
"""
