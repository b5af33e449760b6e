"""CPU and memory of the fleet simulator as the fleet and the simulated time grow.

    .venv/bin/python bench/simulator_cost.py [--minutes 10] [--day]

The simulator replays every request through the replicas' continuous-batching model, so its
cost follows requests (each routed, admitted, finished and scored) and replica-ticks (every
replica advanced and metered every 0.5 s). Runs apa on synthetic chat traffic (the Azure
shapes) sized for about 20, 50 and 200 h100-llama-8b replicas over `--minutes`, and a whole day
for about 10 replicas; with `--day`, also the issue's bar: a whole day of about 200 replicas
(~10^8 requests; about an hour of CPU). Each row runs in its own process and prints the CPU
of generating the trace and of simulating it (sizing the oracle, then the replay), the
microseconds of simulation per request, the CPU a simulated day at that rate would take, and
the process's peak memory.
"""

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from capacity.simulate import traces
from capacity.simulate.fleet import FleetConfig
from capacity.simulate.scenario import simulate
from dataplane.runtime.profiles import get_profile

QPS_PER_REPLICA = 12.0  # about what an h100-llama-8b replica serves of these shapes at the SLO


def one(label: str, replicas: int, seconds: float) -> None:
    started = time.process_time()
    trace = traces.diurnal(1, seconds=seconds, base_qps=replicas * QPS_PER_REPLICA / 1.8, bursts=0)
    generated = time.process_time()
    fleet = FleetConfig(pod_start_s=30.0)
    result = simulate(get_profile("h100-llama-8b"), trace, "apa", fleet, warmup_s=60.0)
    cpu = time.process_time() - generated
    per_day = cpu * 86400.0 / seconds
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"{label:26} {result.peak_replicas:6d} {len(trace):11d} {generated - started:7.1f} {cpu:8.1f}"
        f" {cpu / len(trace) * 1e6:7.1f} {per_day / 60:11.1f} {rss_gb:7.2f}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0, help="simulated minutes per fleet size")
    parser.add_argument("--day", action="store_true", help="also a whole day of ~200 replicas (~1 h)")
    parser.add_argument("--one", nargs=3, metavar=("LABEL", "REPLICAS", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one[0], int(args.one[1]), float(args.one[2]))
        return 0
    print(
        f"{'run':26} {'peak':>6} {'requests':>11} {'gen_s':>7} {'sim_s':>8} {'us/req':>7}"
        f" {'day_cpu_min':>11} {'rss_gb':>7}",
        flush=True,
    )
    seconds = args.minutes * 60.0
    rows = [(f"~{n} replicas, {args.minutes:g} min", n, seconds) for n in (20, 50, 200)]
    rows.append(("~10 replicas, one day", 10, 86400.0))
    if args.day:
        rows.append(("~200 replicas, one day", 200, 86400.0))
    for label, replicas, secs in rows:
        subprocess.run([sys.executable, __file__, "--one", label, str(replicas), str(secs)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
