"""CPU and memory of the fleet simulator as the fleet and the simulated time grow.

    .venv/bin/python bench/simulator_cost.py [--minutes 10] [--native] [--day] [--smoke]

The simulator replays every request through the replicas' continuous-batching model, so its
cost follows requests (each routed, admitted, finished and scored) and replica-ticks (every
replica advanced and metered every 0.5 s). Runs apa on synthetic chat traffic (the Azure
shapes) sized for about 20, 50 and 200 h100-llama-8b replicas over `--minutes`, and a whole day
for about 10 replicas; with `--day`, also the issue's bar: a whole day of about 200 replicas
(~10^8 requests). Each row runs in its own process and prints the CPU of generating the trace
and of simulating it (sizing the oracle, then the replay), microseconds of simulation per
request, the CPU a simulated day at that rate would take, and the process's peak memory.
With `--native`, every row runs again on the mypyc-compiled modules (`make sim-native`, built
first if needed) and the last column is the speed-up of the whole row (generation and
simulation) over plain Python. --smoke: one row, about 2 replicas for a minute, in seconds.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

# Appended, not inserted: a compiled build on PYTHONPATH comes first.
sys.path.append(str(Path(__file__).resolve().parent.parent))

from capacity.simulate import fleet as fleet_module
from capacity.simulate import traces
from capacity.simulate.fleet import FleetConfig
from capacity.simulate.scenario import simulate
from engine_model.profiles import get_profile

ROOT = Path(__file__).resolve().parent.parent
QPS_PER_REPLICA = 12.0  # about what an h100-llama-8b replica serves of these shapes at the SLO


def one(replicas: int, seconds: float) -> dict[str, float | str]:
    started = time.process_time()
    trace = traces.diurnal(1, seconds=seconds, base_qps=replicas * QPS_PER_REPLICA / 1.8, bursts=0)
    generated = time.process_time()
    result = simulate(
        get_profile("h100-llama-8b"), trace, "apa", FleetConfig(pod_start_s=30.0), warmup_s=60.0
    )
    sim = time.process_time() - generated
    return {
        "build": "native" if fleet_module.__file__.endswith(".so") else "python",
        "peak": result.peak_replicas,
        "requests": len(trace),
        "gen_s": generated - started,
        "sim_s": sim,
        "us_per_req": sim / len(trace) * 1e6,
        "day_cpu_min": (generated - started + sim) * 86400.0 / seconds / 60.0,
        "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def child(replicas: int, seconds: float, native: bool) -> dict[str, float | str]:
    env = dict(os.environ)
    if native:
        env["PYTHONSAFEPATH"] = "1"  # not the working directory (the sources) first
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT / "build/sim-native"), env.get("PYTHONPATH")])
        )
    out = subprocess.run(
        [sys.executable, __file__, "--one", str(replicas), str(seconds)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    row: dict[str, float | str] = json.loads(out.splitlines()[-1])
    if row["build"] != ("native" if native else "python"):
        raise SystemExit(f"asked for the {'native' if native else 'python'} build, ran {row['build']}")
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0, help="simulated minutes per fleet size")
    parser.add_argument(
        "--native", action="store_true", help="also on the compiled modules (make sim-native)"
    )
    parser.add_argument(
        "--day", action="store_true", help="also a whole day of ~200 replicas (~10^8 requests)"
    )
    parser.add_argument("--one", nargs=2, metavar=("REPLICAS", "SECONDS"), help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: ~2 replicas for 1 min")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(int(args.one[0]), float(args.one[1]))))
        return 0
    if args.native:
        subprocess.run(["make", "-s", "-C", str(ROOT), "sim-native"], check=True)
    print(
        f"{'run':26} {'build':>6} {'peak':>5} {'requests':>11} {'gen_s':>7} {'sim_s':>8} {'us/req':>7}"
        f" {'day_cpu_min':>11} {'rss_gb':>6} {'speed-up':>8}",
        flush=True,
    )
    seconds = args.minutes * 60.0
    rows = [(f"~{n} replicas, {args.minutes:g} min", n, seconds) for n in (20, 50, 200)]
    rows.append(("~10 replicas, one day", 10, 86400.0))
    if args.smoke:
        rows = [("~2 replicas, 1 min", 2, 60.0)]
    elif args.day:
        rows.append(("~200 replicas, one day", 200, 86400.0))
    for label, replicas, secs in rows:
        python_cpu = 0.0
        for native in (False, True) if args.native else (False,):
            r = child(replicas, secs, native)
            cpu = float(r["gen_s"]) + float(r["sim_s"])
            python_cpu = python_cpu or cpu
            print(
                f"{label:26} {r['build']:>6} {r['peak']:5d} {r['requests']:11d} {r['gen_s']:7.1f}"
                f" {r['sim_s']:8.1f} {r['us_per_req']:7.1f} {r['day_cpu_min']:11.1f} {r['rss_gb']:6.2f}"
                f" {python_cpu / cpu:7.2f}x",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
