"""CPU cost of the fleet simulator as the fleet and the simulated time grow.

    .venv/bin/python bench/simulator_cost.py [--minutes 10]

The simulator replays every request through the replicas' continuous-batching model, so its
cost follows requests (each routed, admitted, finished and scored) and replica-ticks (every
replica advanced and metered every 0.5 s). Runs apa on synthetic chat traffic (the Azure
shapes) sized for about 20, 50 and 200 h100-llama-8b replicas over `--minutes`, and a whole day
for about 10 replicas; prints CPU seconds, simulated requests, microseconds per request and the
CPU a simulated day of that fleet would take at the same rate.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from capacity.simulate import traces
from capacity.simulate.fleet import FleetConfig
from capacity.simulate.scenario import simulate
from dataplane.runtime.profiles import get_profile

QPS_PER_REPLICA = 12.0  # about what an h100-llama-8b replica serves of these shapes at the SLO


def run(label: str, replicas: int, seconds: float) -> None:
    trace = traces.diurnal(1, seconds=seconds, base_qps=replicas * QPS_PER_REPLICA / 1.8, bursts=0)
    started = time.process_time()
    fleet = FleetConfig(pod_start_s=30.0)
    result = simulate(get_profile("h100-llama-8b"), trace, "apa", fleet, warmup_s=60.0)
    cpu = time.process_time() - started
    per_day = cpu * 86400.0 / seconds
    print(
        f"{label:26} {result.peak_replicas:6d} {len(trace):10d} {cpu:8.1f} {cpu / len(trace) * 1e6:8.1f}"
        f" {per_day / 60:10.1f}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0, help="simulated minutes per fleet size")
    args = parser.parse_args()
    print(f"{'run':26} {'peak':>6} {'requests':>10} {'cpu_s':>8} {'us/req':>8} {'day_cpu_min':>10}")
    seconds = args.minutes * 60.0
    for replicas in (20, 50, 200):
        run(f"~{replicas} replicas, {args.minutes:g} min", replicas, seconds)
    run("~10 replicas, one day", 10, 86400.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
