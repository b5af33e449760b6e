"""Four router processes (``python -m dataplane.router``, static mode, ``--redis``) share one
endpoint's 6,000 MU/min reservation over real sockets, with faults, in one 60-s run:

- traffic at 2x the reservation, split 70/20/5/5 % over the four, at a fixed rate (bounded);
- Redis (a redis-server of this test's own) stopped from t = 15 s to 25 s, and one router
  (a 5 % one) killed at t = 40 s, its traffic sent to the next router as a client would;
- admitted MU (the exact price, ``x-mu-cost``) over the 60 s is within +-5 % of the reservation
  and no 10-s window exceeds 1.2x; the routers said fallback in their metrics and logs;
- a second endpoint (two more routers on another Redis database of the same server, 1,500
  MU/min) at 0.8x its reservation, split evenly, never sees a 429.

GCRA burst 1 s (``--gcra-burst-s 1``): a 10-s window holds at most 10 s + the burst of the rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.router.conftest import free_port
from tests.router.fakepod import FakePod
from tests.router.test_lease_redis import own_redis_server

pytestmark = pytest.mark.stack  # redis-server, routers and a pod as subprocesses

RESERVATION = 6000.0  # MU/min, endpoint A
SECOND = 1500.0  # MU/min, endpoint B
DURATION_S = 60.0
REDIS_DOWN = (15.0, 25.0)  # s into the run
KILL_AT = 40.0  # s: router 3 (5 %) killed
SPLIT = (0.70, 0.20, 0.05, 0.05)
MAX_TOKENS = 100  # the pod answers 10 prompt + 100 completion tokens: 2.12 MU at static prices
MU_PER_REQUEST = 0.002 * 10 + 0.02 * MAX_TOKENS + 0.1
BODY = {"model": "m", "prompt": "Say hello to the routers", "max_tokens": MAX_TOKENS}


@dataclass
class RouterProc:
    port: int
    proc: subprocess.Popen[bytes]
    log: str
    dead: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Outcome:
    admitted: list[tuple[float, float]] = field(default_factory=list)  # (sent at, s into the run; MU)
    # status -> count (0: no router answered; -1: a timeout or a broken connection)
    statuses: dict[int, int] = field(default_factory=dict)
    refused: list[tuple[float, int]] = field(default_factory=list)  # (sent at, router) of the others
    late_s: float = 0.0  # the latest a request left after its time, s (a busy machine's lag)


@contextlib.contextmanager
def routers(
    n: int, pod_url: str, reservation: float, redis_url: str, logdir: str
) -> Iterator[list[RouterProc]]:
    started: list[RouterProc] = []
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    try:
        for i in range(n):
            port = free_port()
            log = os.path.join(logdir, f"router-{reservation:.0f}-{i}.log")
            cmd = [sys.executable, "-m", "dataplane.router", "--listen", f"127.0.0.1:{port}"]
            cmd += ["--backends", pod_url, "--rate-limit-mu-per-min", str(reservation), "--redis", redis_url]
            cmd += ["--gcra-burst-s", "1", "--workers", "1", "--log-level", "warning"]
            with open(log, "wb") as out:
                proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
            started.append(RouterProc(port, proc, log))
        yield started
    finally:
        for r in started:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        for r in started:
            try:
                r.proc.wait(10)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()


async def wait_ready(client: httpx.AsyncClient, rs: list[RouterProc]) -> None:
    deadline = time.monotonic() + 30
    for r in rs:
        while True:
            assert r.proc.poll() is None, pathlib.Path(r.log).read_text()
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{r.url}/health")).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"router on {r.port} not ready"
            await asyncio.sleep(0.1)


async def drive(
    client: httpx.AsyncClient, rs: list[RouterProc], rates: list[float], t0: float, out: Outcome
) -> None:
    """Requests at a fixed rate per router (req/s) from t0 for DURATION_S; a request to a dead
    router goes to the next live one, as a client-side balancer would send it."""
    inflight = asyncio.Semaphore(256)  # bounded: a stalled router cannot pile up tasks
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int) -> None:
        async with inflight:
            sent_at = time.monotonic() - t0  # when the routers saw it, late or not
            for j in [*range(i, len(rs)), *range(i)]:
                if rs[j].dead:
                    continue
                try:
                    resp = await client.post(f"{rs[j].url}/v1/completions", json=BODY)
                except httpx.ConnectError:
                    continue  # refused: that router is gone
                except httpx.TransportError:  # slow or broken: an error, never sent twice
                    out.statuses[-1] = out.statuses.get(-1, 0) + 1
                    return
                out.statuses[resp.status_code] = out.statuses.get(resp.status_code, 0) + 1
                if resp.status_code == 200:
                    out.admitted.append((sent_at, float(resp.headers["x-mu-cost"])))
                else:
                    out.refused.append((sent_at, j))
                return
            out.statuses[0] = out.statuses.get(0, 0) + 1

    async def stream(i: int) -> None:
        k = 0
        while (at := (k + 0.5) / rates[i]) < DURATION_S:
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            out.late_s = max(out.late_s, time.monotonic() - t0 - at)
            task = asyncio.create_task(one(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            k += 1

    await asyncio.gather(*(stream(i) for i in range(len(rs))))
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=15)
        for task in late:  # bounded: what has not answered by now is an error
            task.cancel()
            out.statuses[-1] = out.statuses.get(-1, 0) + 1


def windows(admitted: list[tuple[float, float]], width: float) -> list[float]:
    """MU admitted in each [s, s + width) for s = 0, 1, ... within the run."""
    return [sum(mu for t, mu in admitted if s <= t < s + width) for s in range(int(DURATION_S - width) + 1)]


async def metric(client: httpx.AsyncClient, r: RouterProc, name: str, labels: str = "") -> float:
    """The sum of a metric's samples on one router (those whose labels contain ``labels``)."""
    text = (await client.get(f"{r.url}/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and labels in line
    )


def run_scenario() -> dict[str, Any]:
    """The whole run (redis-server, routers, pod, load, faults), as the JSON-able figures."""
    port = free_port()
    with tempfile.TemporaryDirectory() as logdir, contextlib.ExitStack() as servers:
        servers.enter_context(own_redis_server(port))

        async def go() -> dict[str, Any]:
            pod = await FakePod("pod-0").start()
            pod.completion_tokens = MAX_TOKENS
            limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
            try:
                with (
                    routers(4, pod.url, RESERVATION, f"redis://127.0.0.1:{port}/0", logdir) as a,
                    routers(2, pod.url, SECOND, f"redis://127.0.0.1:{port}/1", logdir) as b,
                ):
                    async with httpx.AsyncClient(timeout=10, limits=limits) as client:
                        await wait_ready(client, a + b)
                        return await faulted_run(client, a, b, port, servers)
            finally:
                await pod.stop()

        return asyncio.run(go())


# A run whose load generator sent a request this late measured the machine, not the routers: a
# CI run with a vLLM engine starting beside it sent nothing for 20 s (26 s late) and admitted
# 0.57x. Such a run is played once more; a late run never passes or fails on its figures.
LATE_LIMIT_S = 2.0


def test_four_routers_hold_a_shared_reservation_through_redis_loss_and_a_dead_router():
    for _ in range(2):
        # In a fresh interpreter: a load generator on the test process's event loop was starved
        # there after the rest of the suite (30 s late, measured), never when run alone.
        run = subprocess.run(
            [sys.executable, "-m", "tests.router.test_lease_accuracy"],
            capture_output=True,
            timeout=240,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
            check=False,
        )
        assert run.returncode == 0, run.stderr.decode()[-4000:]
        got = json.loads(run.stdout.decode().strip().splitlines()[-1])
        print(got["summary"])
        if got["late_s"] <= LATE_LIMIT_S:
            break
    assert got["late_s"] <= LATE_LIMIT_S, f"the load generator was starved twice: {got['summary']}"
    reserved = RESERVATION * DURATION_S / 60
    assert abs(got["total"] / reserved - 1) <= 0.05, got["summary"]
    assert got["worst"] <= 1.2 * RESERVATION / 6, got["summary"]
    assert set(got["statuses_a"]) <= {"200", "429"} and got["statuses_a"].get("429", 0) > 0, got["summary"]
    assert set(got["statuses_b"]) == {"200"}, got["summary"]  # 0.8x: never a 429, even in fallback
    assert got["fallbacks"] == [1] * 5, got["summary"]  # each live router fell back once, and came back
    assert got["leased"] == [1] * 5  # all back on leases
    assert got["log_lines"] == [[1, 1]] * 3, got["summary"]  # one line in, one line out


async def faulted_run(
    client: httpx.AsyncClient,
    a: list[RouterProc],
    b: list[RouterProc],
    port: int,
    servers: contextlib.ExitStack,
) -> dict[str, Any]:
    per_s_a = 2 * RESERVATION / 60 / MU_PER_REQUEST  # 2x: 94 req/s
    per_s_b = 0.8 * SECOND / 60 / MU_PER_REQUEST  # 0.8x: 9.4 req/s
    out_a, out_b = Outcome(), Outcome()
    t0 = time.monotonic() + 0.5

    async def faults() -> None:
        await asyncio.sleep(t0 + REDIS_DOWN[0] - time.monotonic())
        # in a thread: the load goes on meanwhile
        await asyncio.to_thread(servers.close)  # Redis stopped (killed: nothing kept)
        await asyncio.sleep(t0 + REDIS_DOWN[1] - time.monotonic())
        await asyncio.to_thread(servers.enter_context, own_redis_server(port))  # back, empty
        await asyncio.sleep(t0 + KILL_AT - time.monotonic())
        a[3].proc.kill()
        a[3].dead = True

    await asyncio.gather(
        drive(client, a, [share * per_s_a for share in SPLIT], t0, out_a),
        drive(client, b, [per_s_b / 2, per_s_b / 2], t0, out_b),
        faults(),
    )
    fallbacks = [await metric(client, r, "router_lease_fallback_total") for r in a[:3] + b]
    leased = [await metric(client, r, "router_limiter_mode", 'mode="leased"') for r in a[:3] + b]

    total = sum(mu for _, mu in out_a.admitted)
    worst = max(windows(out_a.admitted, 10.0))
    reserved = RESERVATION * DURATION_S / 60
    summary = (
        f"endpoint A: admitted {total:.0f} MU of {reserved:.0f} ({total / reserved:.3f}x), worst 10-s window "
        f"{worst:.0f} MU ({worst / (RESERVATION / 6):.3f}x), statuses {out_a.statuses}; "
        f"endpoint B statuses {out_b.statuses} (refused at {out_b.refused}); fallbacks {fallbacks}; MU per "
        f"5 s {[round(w) for w in windows(out_a.admitted, 5.0)[::5]]}; load generator late by up to "
        f"{max(out_a.late_s, out_b.late_s):.2f} s"
    )
    logs = [pathlib.Path(r.log).read_text() for r in a[:3]]
    return {
        "summary": summary,
        "total": total,
        "worst": worst,
        "late_s": max(out_a.late_s, out_b.late_s),
        "statuses_a": {str(k): v for k, v in out_a.statuses.items()},
        "statuses_b": {str(k): v for k, v in out_b.statuses.items()},
        "fallbacks": fallbacks,
        "leased": leased,
        "log_lines": [[t.count("limiter fallback:"), t.count("limiter leased again")] for t in logs],
    }


if __name__ == "__main__":  # the scenario, run by the test in a fresh interpreter
    print(json.dumps(run_scenario()))
