"""Balancing through real sockets: our router in front of SIMULATED engines (no model, no GPU).

    .venv/bin/python bench/balancing_http.py [--engines 4] [--seconds 40] [--utilisation 0.85] [--smoke]

Runs the simulated engine (``python -m dataplane.runtime.sim``) with the ``tiny-test`` profile:
4 sequences at most, a 10 ms step +1 ms per sequence, so a pod is a handful of slots and a long
generation holds one for seconds, as on a GPU serving a large model. For each policy a fresh
router (``python -m dataplane.router``) is started and an open-loop Poisson client sends the
same request sequence: 80 % short (max_tokens 16) and 20 % long (max_tokens 256), streamed; it
records time to first token and end-to-end latency. The rate is ``--utilisation`` of the
fleet's capacity, computed from the profile: mean tokens per request x step time per token per
slot.

End-to-end p99 has a floor no router can beat: the p99 request is a long one, and its own service
time (256 decode steps at a full batch, ~3.6 s) is most of it. So besides TTFT and end-to-end it
prints each request's *delay*: end-to-end minus that request's own service time at a full batch
with no wait, i.e. what queueing and imbalance added, the part a balancing policy controls. The
last row is p2c-mu as deployed: the pod's target concurrency set to the engine's 4 slots (the
other rows have none unless --target-concurrency is given), so excess requests wait at the router
for the first free slot, not behind a long generation in one engine's queue.

Cheap on CPU (time scale 1: ~100 engine steps/s per pod) but the machine is shared: expect noise.
--smoke: 2 engines, a second of arrivals, one run per policy, long requests of SMOKE_LONG tokens
and free ports, in seconds: does it still run, not what it gives.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dataplane.runtime import sim_tokenizer
from engine_model import perf_model
from engine_model.profiles import get_profile

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
SHORT, LONG, LONG_SHARE = 16, 256, 0.2
SMOKE_LONG = 32  # --smoke's long requests: a run waits for its last one
STEP_S = 0.010 + 0.001 * 4  # tiny-test step at a full batch of 4, s
SLOTS = 4
PROMPT = "x" * 200


@functools.cache
def service_s(max_tokens: int) -> float:
    """A request's own service time at a full batch and no wait, by the engine's performance model."""
    profile = get_profile("tiny-test")
    ttft, _ = perf_model.solo_latency_s(profile, len(sim_tokenizer.encode(PROMPT)), max_tokens)
    return ttft + (max_tokens - 1) * perf_model.decode_step_s(profile, SLOTS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


async def one(port: int, max_tokens: int, start: float, out: list[tuple[float, float, int, int]]) -> None:
    body = json.dumps(
        {"model": "sim-tiny", "prompt": PROMPT, "max_tokens": max_tokens, "stream": True}
    ).encode()
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        ttft = float("nan")
        data = b""
        status = 0
        while True:
            chunk = await asyncio.wait_for(r.read(65536), 120)
            if not chunk:
                break
            data += chunk
            if not status and b"\r\n" in data:
                status = int(data.split(b" ", 2)[1])
            if ttft != ttft and b"data: " in data:
                ttft = time.monotonic() - start
            if b"[DONE]" in data:
                break
        w.close()
        out.append((ttft, time.monotonic() - start, status, max_tokens))
    except (TimeoutError, OSError):
        out.append((float("nan"), time.monotonic() - start, 0, max_tokens))


def pct(xs: list[float], p: float) -> float:
    s = sorted(x for x in xs if x == x)
    return s[min(len(s) - 1, int(p * len(s)))] if s else float("nan")


async def run_policy(
    policy: str, engines: list[int], port: int, arrivals: list[tuple[float, int]], target_concurrency: int
) -> dict:
    backends = ",".join(f"http://127.0.0.1:{p}" for p in engines)
    router = subprocess.Popen(
        [
            PY,
            "-m",
            "dataplane.router",
            "--listen",
            f"127.0.0.1:{port}",
            "--backends",
            backends,
            "--policy",
            policy,
            "--target-concurrency",
            str(target_concurrency),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_port(port)
        out: list[tuple[float, float, int, int]] = []
        tasks = []
        t0 = time.monotonic()
        for at, max_tokens in arrivals:
            delay = t0 + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(port, max_tokens, time.monotonic(), out)))
        await asyncio.wait_for(asyncio.gather(*tasks), 300)
    finally:
        router.send_signal(signal.SIGTERM)
        router.wait(10)
    ok = [o for o in out if o[2] == 200]
    return {
        "ok": len(ok),
        "failed": len(out) - len(ok),
        "ttft_p50": pct([o[0] for o in ok], 0.5),
        "ttft_p99": pct([o[0] for o in ok], 0.99),
        "e2e_p50": pct([o[1] for o in ok], 0.5),
        "e2e_p99": pct([o[1] for o in ok], 0.99),
        "delay_p99": pct([o[1] - service_s(o[3]) for o in ok], 0.99),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--utilisation", type=float, default=0.85)
    ap.add_argument("--policies", default="round-robin,least-request,p2c,p2c-mu")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="runs per policy; the median is printed")
    ap.add_argument("--target-concurrency", type=int, default=0, help="router limit per pod (0 = none)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: 2 engines, 1 s, 1 run each")
    args = ap.parse_args()
    if args.smoke:  # again, with these as the defaults (an explicit argument still wins)
        ap.set_defaults(engines=2, seconds=1.0, repeats=1)
        args = ap.parse_args()
    long = SMOKE_LONG if args.smoke else LONG
    mean_tokens = (1 - LONG_SHARE) * SHORT + LONG_SHARE * long
    capacity = args.engines * SLOTS / (mean_tokens * STEP_S)  # requests/s
    rate = args.utilisation * capacity
    rng = random.Random(args.seed)
    arrivals, t = [], 0.0
    while t < args.seconds:
        t += rng.expovariate(rate)
        arrivals.append((t, long if rng.random() < LONG_SHARE else SHORT))
    print(
        f"SIMULATED engines (dataplane.runtime.sim, tiny-test profile) x {args.engines}, real sockets; "
        f"capacity ~{capacity:.1f} req/s, offered {rate:.1f} req/s ({args.utilisation:.0%}), "
        f"{len(arrivals)} requests, router target concurrency {args.target_concurrency or 'off'}, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    ports = (
        [free_port() for _ in range(args.engines)] if args.smoke else [18701 + i for i in range(args.engines)]
    )
    router_port = free_port() if args.smoke else 18799
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sims = [
        subprocess.Popen(
            [
                PY,
                "-m",
                "dataplane.runtime.sim",
                "--port",
                str(p),
                "--profile",
                "tiny-test",
                "--time-scale",
                "1",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in ports
    ]
    try:
        for p in ports:
            await wait_port(p)
        runs = [(p, p, args.target_concurrency) for p in args.policies.split(",")]
        if not args.target_concurrency:
            runs.append((f"p2c-mu tc={SLOTS}", "p2c-mu", SLOTS))
        print(
            f"{'policy':<15} {'ok':>5} {'failed':>6} {'ttft_p50':>9} {'ttft_p99':>9} "
            f"{'e2e_p50':>8} {'e2e_p99':>8} {'delay_p99':>9}"
        )
        results = {}
        for label, policy, target in runs:
            # the router's random choices differ per run (unseeded): median of the repeats
            reps = [
                await run_policy(policy, ports, router_port, arrivals, target) for _ in range(args.repeats)
            ]
            r = results[label] = {k: sorted(x[k] for x in reps)[len(reps) // 2] for k in reps[0]}
            print(
                f"{label:<15} {r['ok']:5d} {r['failed']:6d} {r['ttft_p50']:9.3f} {r['ttft_p99']:9.3f} "
                f"{r['e2e_p50']:8.3f} {r['e2e_p99']:8.3f} {r['delay_p99']:9.3f}   ttft_p99 per run: "
                + " ".join(f"{x['ttft_p99']:.2f}" for x in reps),
                flush=True,
            )
        floor = pct([service_s(m) for _, m in arrivals], 0.99)
        base = results.get("round-robin")
        if base:
            print(
                f"e2e floor: the p99 request's own service time at a full batch, no wait = {floor:.3f} s "
                f"(half of round-robin's e2e p99 = {base['e2e_p99'] / 2:.3f} s)"
            )
            for label, r in results.items():
                ratios = " ".join(f"{k} {r[k] / base[k]:.2f}" for k in ("ttft_p99", "e2e_p99", "delay_p99"))
                print(f"ratio {label}/round-robin: {ratios}")
        print(f"load after: {os.getloadavg()[0]:.2f}")
    finally:
        for s in sims:
            s.send_signal(signal.SIGTERM)
        for s in sims:
            with contextlib.suppress(subprocess.TimeoutExpired):
                s.wait(10)


if __name__ == "__main__":
    asyncio.run(main())
