"""Can the simulated engine over HTTP serve the rates its profile sustains, at a time scale?

    PYTHONPATH=. python bench/sim_http_ceiling.py [--profile h100-llama-8b] [--time-scale 20] [--smoke]

For a few short shapes (the ones a benchmark over HTTP reads client-bound), it prints the rate the
profile sustains at the SLO on the virtual clock (simulated req/min), the wall requests per
second an HTTP engine at `--time-scale` must then answer, and what the simulated engine
(`python -m dataplane.runtime.sim`) answers on this machine under wrk (one C thread, 256
connections, 10 s): at the time scale, and at 1000 (where the simulated GPU is never the limit,
so the figure is the process's HTTP ceiling). Served / needed below 1 means no client, however
fast, can measure the shape at that scale here: the engine process is the limit. Needs `wrk`;
traffic only to 127.0.0.1. --smoke: one shape, wrk with 8 connections for 1 s, in seconds (without
wrk, the engines are started and answer, and the served columns say "no wrk"): does it still run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time

import httpx

from capacity.benchmark.config import SweepConfig, on_virtual_clock
from capacity.benchmark.drivers import SimulatedDriver
from capacity.benchmark.results import shape_name
from capacity.benchmark.sweep import sweep
from engine_model.profiles import PROFILES
from tests.runtime.support import free_port

SHAPES = ((16, 1), (128, 1), (16, 16))
CONNECTIONS, SECONDS = 256, 10
SMOKE_SHAPES, SMOKE_CONNECTIONS, SMOKE_SECONDS = ((16, 16),), 8, 1  # --smoke's


def sustained_per_minute(
    profile: str, shapes: tuple[tuple[int, int], ...] = SHAPES
) -> dict[tuple[int, int], float]:
    driver = SimulatedDriver(PROFILES[profile], seed=0)
    config = on_virtual_clock(SweepConfig(seed=0, shapes=shapes))
    result = asyncio.run(sweep(driver, config, clock=lambda: driver.elapsed_s))
    return {s.shape: s.sustainable_per_minute for s in result.shapes}


def served_per_s(
    profile: str,
    time_scale: float,
    shape: tuple[int, int],
    connections: int = CONNECTIONS,
    seconds: int = SECONDS,
) -> float | None:
    """wrk's requests/s against a fresh simulated engine at this time scale; None without wrk
    (--smoke), once the engine has answered."""
    port = free_port()
    engine = subprocess.Popen(
        [sys.executable, "-m", "dataplane.runtime.sim", "--port", str(port), "--profile", profile,
         "--served-model-name", "m", "--time-scale", str(time_scale)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1/completions"
    body = {"model": "m", "prompt": [100 + i for i in range(shape[0])], "max_tokens": shape[1]}
    body |= {"min_tokens": shape[1], "ignore_eos": True}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.post(url, json=body, timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if engine.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the simulated engine did not answer on {url}")
            time.sleep(0.2)
        if shutil.which("wrk") is None:
            return None
        with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
            script.write(
                f'wrk.method = "POST"\nwrk.body = {json.dumps(json.dumps(body))}\n'
                'wrk.headers["Content-Type"] = "application/json"\n'
            )
            script.flush()
            run = subprocess.run(
                ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", script.name, url],
                capture_output=True, text=True, timeout=seconds + 30,
            )  # fmt: skip
        if "Non-2xx" in run.stdout:
            raise SystemExit(f"the engine answered errors:\n{run.stdout}")
        found = re.search(r"Requests/sec:\s+([\d.]+)", run.stdout)
        if not found:
            raise SystemExit(f"no rate in wrk's output:\n{run.stdout}{run.stderr}")
        return float(found.group(1))
    finally:
        engine.terminate()
        engine.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="h100-llama-8b", choices=sorted(PROFILES))
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: one shape, wrk for 1 s")
    args = parser.parse_args()
    if shutil.which("wrk") is None and not args.smoke:
        raise SystemExit("needs wrk (apt-get install wrk)")
    shapes, connections, seconds = (
        (SMOKE_SHAPES, SMOKE_CONNECTIONS, SMOKE_SECONDS) if args.smoke else (SHAPES, CONNECTIONS, SECONDS)
    )
    sustained = sustained_per_minute(args.profile, shapes)
    print(f"{args.profile} at --time-scale {args.time_scale:g}, wrk -t1 -c{connections} -d{seconds}s")
    print("shape | sustained at the SLO | needed at the scale | served at it | at 1000 | served/needed")
    for shape in shapes:
        needed = sustained[shape] / 60 * args.time_scale
        at_scale = served_per_s(args.profile, args.time_scale, shape, connections, seconds)
        ceiling = served_per_s(args.profile, 1000.0, shape, connections, seconds)
        if at_scale is None or ceiling is None:  # --smoke without wrk: the engines answered
            served = "no wrk | no wrk | -"
        else:
            served = f"{at_scale:,.0f} /s | {ceiling:,.0f} /s | {max(at_scale, ceiling) / needed:.2f}"
        print(f"{shape_name(*shape)} | {sustained[shape]:,.0f} /min | {needed:,.0f} /s | {served}")


if __name__ == "__main__":
    main()
