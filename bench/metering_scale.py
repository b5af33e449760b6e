"""What the routers' per-second load samples cost Redis, and the autoscaler pass that reads them.

A bounded synthetic fleet: ROUTERS routers each publish one sample per endpoint (ENDPOINTS of
them) per second for SECONDS seconds, into a redis-server this script starts on a free
127.0.0.1 port (no persistence, maxmemory 512 MB), then the collector's reader reads the slot
back (5 seconds x every endpoint), as the autoscaler pass does every 5 s. Two layouts side by
side on the same server:
  hash    main before this change: one hash per endpoint and second, HINCRBYFLOAT per field and
          tenant (`publish_hash` below, copied from it), read with a pipeline of HGETALLs;
  slots   dataplane.router.metering.publish: one script per router second that, past the
          router's mark, adds per endpoint one BITFIELD INCRBY of int64 slots and one EXPIRE and
          appends the billable samples to the billing stream; read by
          controlplane.endpoints.samples.RedisSeconds (MGETs; the stream is the collector's to bill).
Measured from Redis' INFO (commands, its CPU, bytes in, memory) and this process's CPU for the
reader; the reader's results of both layouts are compared. Two fleet sizes show what scales
with routers x endpoints (writes) and with endpoints (reads, memory); the last lines extrapolate
to 1,000 routers x 10,000 endpoints with the formulas printed.

    python bench/metering_scale.py                # sizes 20x500 and 100x1000, 5 s each
    SIZES=10x100,40x400 SECONDS=5 python bench/metering_scale.py
    python bench/metering_scale.py --smoke        # 2 routers x 10 endpoints, 2 s: does it run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any

import django
import redis
import redis.asyncio as aredis

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django.setup()  # the collector's reader lives with its models

from controlplane.endpoints.samples import RedisSeconds, Rows  # noqa: E402
from dataplane.router.metering import publish  # noqa: E402
from dataplane.wire.load_samples import (  # noqa: E402
    BILLING_STREAM,
    ROW_TTL_S,
    EndpointSecond,
    RouterSecond,
    TrafficSample,
    routers_key,
)

FIRST_SECOND = 1_700_000_000
TTL_S = ROW_TTL_S  # the routers' --metrics-ttl-s default: how many seconds of keys Redis holds
WRITE_TTL_S = 3600  # what the synthetic routers set: writing the larger fleet takes minutes here
TARGET = (1000, 10_000)  # routers, endpoints: the figure the issue asks for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sample(router: int, endpoint: int, second: int) -> TrafficSample:
    """A busy endpoint's second at one router: a few requests, two latency buckets, no errors.
    Amounts are exact in binary and in millionths, so both layouts' sums are exact."""
    n = 1 + (router + endpoint + second) % 5
    buckets = [0] * 15
    buckets[2], buckets[4] = n - n // 2, n // 2
    return TrafficSample(
        endpoint,
        f"tenant-{endpoint % 50}",
        requests=n,
        inflight=n * 0.125,
        mu=n * 0.375,
        mu_squared=n * 0.375**2,  # 9/64 a request: exact in binary and in millionths
        squared_requests=n,
        tokens_in=50 * n,
        tokens_out=50 * n,
        latency_ms_sum=n * 31.5,
        latency_buckets=tuple(buckets),
    )


async def publish_hash(client: Any, samples: list[TrafficSample], unix_second: int, ttl_s: int) -> None:
    """main's layout before this change, for comparison (was dataplane.router.metering.publish)."""
    pipe = client.pipeline(transaction=False)
    beat = routers_key(unix_second)
    pipe.incr(beat)
    pipe.expire(beat, ttl_s)
    keys = set()
    for s in samples:
        key = f"mu:load:{s.endpoint}:{unix_second}"
        keys.add(key)
        added = {name: value for name, value in s.fields().items() if value}
        added[f"mu:{s.tenant}"] = s.mu
        for name, value in added.items():
            pipe.hincrbyfloat(key, name, value)
    for key in keys:
        pipe.expire(key, ttl_s)
    await pipe.execute()


def read_hash(client: redis.Redis, endpoint_ids: list[int], first: int, last: int) -> tuple[set[int], Rows]:
    """main's reader before this change (controlplane.endpoints.samples.RedisSeconds)."""
    seconds = range(first, last + 1)
    pipe = client.pipeline(transaction=False)
    for second in seconds:
        pipe.get(routers_key(second))
    for e in endpoint_ids:
        for second in seconds:
            pipe.hgetall(f"mu:load:{e}:{second}")
    values = pipe.execute()
    observed = {s for s, v in zip(seconds, values, strict=False) if v}
    rows: Rows = {}
    i = len(seconds)
    for e in endpoint_ids:
        for second in seconds:
            if values[i]:
                rows[(e, second)] = EndpointSecond.from_fields({k.decode(): v for k, v in values[i].items()})
            i += 1
    return observed, rows


def info(client: redis.Redis) -> dict[str, float]:
    i = client.info("all")
    return {
        "commands": float(i["total_commands_processed"]),
        "cpu_s": float(i["used_cpu_user"]) + float(i["used_cpu_sys"]),
        "bytes_in": float(i["total_net_input_bytes"]),
        "memory": float(i["used_memory"]),
        "keys": float(client.dbsize()),
    }


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


def measure(url: str, layout: str, routers: int, endpoints: int, seconds: int) -> dict[str, Any]:
    sync = redis.Redis.from_url(url)
    sync.flushdb()
    before = info(sync)

    async def write() -> None:
        client = aredis.Redis.from_url(url)
        try:
            for second in range(FIRST_SECOND, FIRST_SECOND + seconds):
                for r in range(routers):
                    rows = [sample(r, e, second) for e in range(1, endpoints + 1)]
                    if layout == "hash":
                        await publish_hash(client, rows, second, WRITE_TTL_S)
                    else:
                        posted = RouterSecond(second, tuple(rows), f"bench-router-{r}")
                        # nothing bills the stream here: bounded by what is written, not the default
                        await publish(client, posted, WRITE_TTL_S, max_billing_entries=routers * seconds)
        finally:
            await client.aclose()

    asyncio.run(write())
    # The billing stream lives until the collector's next pass (5 s): apart from the keys held.
    stream_bytes = float(sync.memory_usage(BILLING_STREAM, samples=0) or 0)
    sync.delete(BILLING_STREAM)
    wrote = delta(info(sync), before)
    ids = list(range(1, endpoints + 1))
    before_read = info(sync)
    cpu0 = time.process_time()
    if layout == "hash":
        result = read_hash(sync, ids, FIRST_SECOND, FIRST_SECOND + seconds - 1)
    else:
        result = RedisSeconds(sync).read(ids, FIRST_SECOND, FIRST_SECOND + seconds - 1)
    reader_cpu_s = time.process_time() - cpu0
    read = delta(info(sync), before_read)
    sync.close()
    samples = routers * endpoints * seconds
    cells = endpoints * seconds
    return {
        "result": result,
        "cmd_per_sample": wrote["commands"] / samples,
        "redis_us_per_sample": wrote["cpu_s"] / samples * 1e6,
        "bytes_in_per_sample": wrote["bytes_in"] / samples,
        "bytes_per_key": wrote["memory"] / max(wrote["keys"], 1),
        "stream_bytes_per_sample": stream_bytes / (routers * endpoints * seconds),  # 0 for the hash
        "keys": wrote["keys"],
        "reader_us_per_cell": reader_cpu_s / cells * 1e6,
        "redis_read_us_per_cell": read["cpu_s"] / cells * 1e6,
    }


def same(a: tuple[set[int], Rows], b: tuple[set[int], Rows]) -> bool:
    if a[0] != b[0] or a[1].keys() != b[1].keys():
        return False
    for cell, x in a[1].items():
        y = b[1][cell]
        for name in ("requests", "inflight", "mu", "tokens_in", "tokens_out", "latency_ms_sum", "queued_mu"):
            if abs(getattr(x, name) - getattr(y, name)) > 1e-6 * max(1.0, abs(getattr(x, name))):
                return False
        if x.latency_buckets != y.latency_buckets:
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, seconds: 2 routers x 10 endpoints, 2 s"
    )
    smoke = parser.parse_args().smoke
    default_sizes, default_seconds = ("2x10", "2") if smoke else ("20x500,100x1000", "5")
    sizes = [tuple(map(int, s.split("x"))) for s in os.environ.get("SIZES", default_sizes).split(",")]
    seconds = int(os.environ.get("SECONDS", default_seconds))
    server = shutil.which("redis-server")
    assert server, "needs redis-server on PATH"
    port = free_port()
    work = tempfile.mkdtemp(prefix="metering-scale.")
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--maxmemory", "512mb", "--dir", work],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(100):
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        print(f"redis-server on 127.0.0.1:{port}; {seconds} s per size; load: {os.getloadavg()[0]:.1f}")
        print(
            "layout routers endpoints cmd/sample redis_us/sample bytes_in/sample keys bytes/key "
            "reader_us/cell redis_read_us/cell results_equal stream_bytes/sample"
        )
        per: dict[str, dict[str, Any]] = {}
        for routers, endpoints in sizes:
            got = {lay: measure(url, lay, routers, endpoints, seconds) for lay in ("hash", "slots")}
            equal = same(got["hash"]["result"], got["slots"]["result"])
            for lay, m in got.items():
                print(
                    f"{lay} {routers} {endpoints} {m['cmd_per_sample']:.2f} {m['redis_us_per_sample']:.2f} "
                    f"{m['bytes_in_per_sample']:.0f} {m['keys']:.0f} {m['bytes_per_key']:.0f} "
                    f"{m['reader_us_per_cell']:.1f} {m['redis_read_us_per_cell']:.2f} {equal} "
                    f"{m.get('stream_bytes_per_sample', 0):.0f}"
                )
                per[lay] = m  # the largest size's figures extrapolate
        r, e = TARGET
        print(f"--- extrapolated to {r} routers x {e} endpoints (dense: each router sees each endpoint)")
        print("samples/s = routers x endpoints; keys held = endpoints x ttl_s + ttl_s;")
        print("reader pass (every 5 s) = 5 x endpoints cells")
        for lay, m in per.items():
            samples_s = r * e
            print(
                f"{lay}: {samples_s * m['cmd_per_sample']:,.0f} commands/s, "
                f"{samples_s * m['redis_us_per_sample'] / 1e6:.1f} Redis core-s/s, "
                f"{samples_s * m['bytes_in_per_sample'] / 1e6:,.0f} MB/s in, "
                f"{e * TTL_S:,} keys = {e * TTL_S * m['bytes_per_key'] / 2**30:.2f} GiB, "
                f"reader pass {5 * e * m['reader_us_per_cell'] / 1e6:.2f} s CPU + "
                f"{5 * e * m['redis_read_us_per_cell'] / 1e6:.3f} s Redis, "
                f"billing stream {5 * samples_s * m['stream_bytes_per_sample'] / 2**30:.2f} GiB (5 s of it)"
            )
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
