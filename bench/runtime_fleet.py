"""Fleet benchmark: what does a simulated engine cost when 200 of them share a small machine?

    python bench/runtime_fleet.py [--pods 200] [--idle-s 20] [--load-s 30] [--rate 0.5] [--smoke]

Starts ``--pods`` simulated engines (one process each) on 127.0.0.1, measures their CPU time
(utime + stime from /proc) over an idle window and over a window of light, bounded load
(``--rate`` requests per second per pod, 16 output tokens each, from one asyncio client with
at most ``--concurrency`` requests in flight), and their resident memory. Prints CPU seconds
per pod per minute for both windows and RSS per pod. All processes are killed at the end.
--smoke: 2 pods, half a second idle and a second of load, in seconds: does it still run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

from dataplane.runtime import http_client

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(int(s.getsockname()[1]))
    for s in socks:
        s.close()
    return ports


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
        except (OSError, IndexError, ValueError):
            continue
    return total / CLK_TCK


def rss_mib(pids: list[int]) -> list[float]:
    out = []
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out.append(int(line.split()[1]) / 1024)
        except OSError:
            continue
    return out


async def wait_healthy(ports: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(ports)
    while pending and time.monotonic() < deadline:
        for port in list(pending):
            try:
                answer = await http_client.request("GET", "127.0.0.1", port, "/health", timeout_s=1)
                if answer.status == 200:
                    pending.discard(port)
            except (OSError, TimeoutError):
                pass
        if pending:
            await asyncio.sleep(0.5)
    if pending:
        raise SystemExit(f"{len(pending)} engines did not come up in {timeout_s} s")


async def drive_load(
    ports: list[int], seconds: float, rate_per_pod: float, concurrency: int
) -> tuple[int, int, list[float]]:
    """Open-loop Poisson arrivals across all pods; bounded in time and in flight."""
    rng = random.Random(0)
    sem = asyncio.Semaphore(concurrency)
    total_rate = rate_per_pod * len(ports)
    body = json.dumps({"prompt": "benchmark prompt " * 8, "max_tokens": 16}).encode()
    headers = {"content-type": "application/json"}  # vLLM refuses a body of another type
    ok = failed = 0
    latencies: list[float] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one(port: int) -> None:
        nonlocal ok, failed
        async with sem:
            start = time.monotonic()
            try:
                resp = await http_client.request(
                    "POST", "127.0.0.1", port, "/v1/completions", body=body, headers=headers, timeout_s=30
                )
                ok += resp.status == 200
                failed += resp.status != 200
                latencies.append(time.monotonic() - start)
            except (OSError, TimeoutError):
                failed += 1

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.sleep(rng.expovariate(total_rate))
        task = asyncio.create_task(one(rng.choice(ports)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=60)
    return ok, failed, latencies


async def main_async(args: argparse.Namespace) -> None:
    ports = free_ports(args.pods)
    procs: list[subprocess.Popen[bytes]] = []
    t0 = time.monotonic()
    try:
        for port in ports:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "dataplane.runtime.sim",
                        "--port",
                        str(port),
                        "--profile",
                        args.profile,
                        "--time-scale",
                        str(args.time_scale),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    cwd=Path(__file__).resolve().parents[1],
                )
            )
        await wait_healthy(ports, timeout_s=180)
        pids = [p.pid for p in procs]
        print(
            f"{args.pods} simulated engines up in {time.monotonic() - t0:.1f} s "
            f"(profile {args.profile}, time scale {args.time_scale:g}x)"
        )
        await asyncio.sleep(2)  # let start-up settle

        c0, w0 = cpu_seconds(pids), time.monotonic()
        await asyncio.sleep(args.idle_s)
        idle_cpu, idle_wall = cpu_seconds(pids) - c0, time.monotonic() - w0

        c0, w0 = cpu_seconds(pids), time.monotonic()
        ok, failed, lat = await drive_load(ports, args.load_s, args.rate, args.concurrency)
        load_cpu, load_wall = cpu_seconds(pids) - c0, time.monotonic() - w0

        rss = rss_mib(pids)
        lat.sort()
        per_min = 60.0 / args.pods
        print(
            f"idle:  {idle_cpu / idle_wall * per_min:.4f} CPU s per pod per minute "
            f"({idle_cpu:.2f} CPU s over {idle_wall:.0f} s for all pods)"
        )
        print(
            f"load:  {load_cpu / load_wall * per_min:.4f} CPU s per pod per minute "
            f"({load_cpu:.2f} CPU s over {load_wall:.0f} s; {ok} ok, {failed} failed, "
            f"{ok / load_wall:.0f} req/s in all, {args.rate:g} req/s per pod offered)"
        )
        if lat:
            print(
                f"       request latency p50 {lat[len(lat) // 2] * 1000:.0f} ms, "
                f"p99 {lat[int(len(lat) * 0.99)] * 1000:.0f} ms (16 tokens, client included)"
            )
        print(
            f"RSS:   {sum(rss) / len(rss):.1f} MiB per pod (min {min(rss):.1f}, "
            f"max {max(rss):.1f}; {sum(rss):.0f} MiB for {len(rss)} pods)"
        )
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--load-s", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=0.5, help="requests/s per pod")
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--profile", default="h100-llama-8b")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: 2 pods, 1 s of load")
    args = parser.parse_args()
    if args.smoke:  # again, with these as the defaults (an explicit argument still wins)
        parser.set_defaults(pods=2, idle_s=0.5, load_s=1.0, rate=2.0)
        args = parser.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
