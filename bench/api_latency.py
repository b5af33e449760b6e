"""API latency at fleet scale, at 10,000 and at 100,000 endpoints, on PostgreSQL with DEBUG off.

    make bench-api    (or: python bench/api_latency.py [--sizes 10000,100000 | --endpoints N]
                               [--requests N] [--sales N] [--budget-s S] [--server production|sync]
                               [--smoke])

Per size, loads the fleet (bench/fleet.py) into a fresh database, serves it with the production
web server (gunicorn -c controlplane/gunicorn.conf.py: 2 uvicorn workers, DEBUG off; --server
sync: 2 sync workers) on loopback and times requests from one sequential client, each on a fresh
connection: one row per scenario, p50 and p99 against the 50 ms goal. Then the sale: SELLERS
sellers at once, each on its own connection with the operator's key, sell (POST) or raise (PATCH)
reservations on random endpoints of the nearly full pools, --sales in all, against a 200 ms goal;
it counts the sales made (201/200) and refused (409), then reads /api/v1/capacity/ and says
whether any pool is oversold. Just before it, the floor: as many calls from SELLERS clients at
once of the cheapest authenticated call (the pools), what the machine answers at that
concurrency whatever the call, and the sale's p50 and p99 against it. Under each of the two,
the machine's CPU per call: the server's workers, the bench database's PostgreSQL backends and
the clients (this process). Last, the p99 ratio between the sizes per scenario. Prints
figures; asserts nothing (this machine is shared and noisy).
"""

import argparse
import base64
import gc
import http.client
import json
import os
import random
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import fleet
from fleet import DB_URL, ROOT, Fleet, Result, header, report, timed_runs

PORT = int(os.environ.get("BENCH_PORT", "18231"))
GOAL_MS = 50.0
SALE_GOAL_MS = 200.0
SELLERS = 20
SALE = f"operator: sale, {SELLERS} concurrent sellers"
FLOOR = f"operator: list pools, {SELLERS} concurrent clients (the floor)"


# How gunicorn serves the API: as in production (uvicorn workers, controlplane/gunicorn.conf.py),
# or with 2 sync workers (WSGI, no event loop or thread hop): the application's own cost, which
# is ~8 ms less per request at p50 here (docs/evaluation/fleet-scale.md).
SERVERS = {
    "production": ["-c", "controlplane/gunicorn.conf.py"],
    "sync": ["controlplane.wsgi", "-w", "2"],
}


def serve(log: IO[bytes], server: str) -> subprocess.Popen[bytes]:
    """The web server on loopback; its log (a line per refused sale: Django logs each 4xx)
    goes to `log`."""
    env = {
        **os.environ,
        "DATABASE_URL": DB_URL,
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECRET_KEY": "bench-only",
        "LOG_LEVEL": "WARNING",
    }
    process = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/gunicorn"),
            *SERVERS[server],
            "-b",
            f"127.0.0.1:{PORT}",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,  # the access log
        stderr=log,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            get("/api/schema/", "")
            return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("gunicorn did not start")


class CpuMeter:
    """CPU seconds of this run's own processes (/proc): the web server's workers, the bench
    database's PostgreSQL backends, and this process (the clients). A backend or a worker that
    ends between two readings takes its CPU with it; the pool keeps them for the whole run."""

    TICK_S = 1 / os.sysconf("SC_CLK_TCK")

    def __init__(self, server: subprocess.Popen[bytes]) -> None:
        self.server = server

    def read(self) -> dict[str, float]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            backends = [pid for (pid,) in cursor.fetchall()]
        children = Path(f"/proc/{self.server.pid}/task/{self.server.pid}/children")
        workers = [int(pid) for pid in children.read_text().split()]
        return {
            "server": sum(map(self.seconds, workers)),
            "PostgreSQL": sum(map(self.seconds, backends)),
            "clients": time.process_time(),
        }

    def seconds(self, pid: int) -> float:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended since it was listed
            return 0.0
        return (int(fields[11]) + int(fields[12])) * self.TICK_S  # utime + stime

    def per_call(self, before: dict[str, float], calls: int) -> str:
        after = self.read()
        parts = {k: (after[k] - before[k]) * 1000 / max(1, calls) for k in after}
        listed = ", ".join(f"{k} {ms:.1f}" for k, ms in parts.items())
        return f"CPU per call, ms: {listed} (in all {sum(parts.values()):.1f})"


def get(path: str, key: str) -> float:
    """One request on a fresh connection; returns its latency in ms."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
    response = conn.getresponse()
    response.read()
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"GET {path} -> {response.status}")
    return (time.perf_counter() - started) * 1000


def read_scenarios(f: Fleet, rng: random.Random) -> dict[str, Callable[[], tuple[str, str]]]:
    from django.db.models import Max, Min

    from controlplane.capacity.models import GpuPool
    from controlplane.endpoints.models import Endpoint

    pages = max(1, f.size.endpoints // 50)
    pool_ids = list(GpuPool.objects.values_list("pk", flat=True))
    first, last = Endpoint.objects.aggregate(first=Min("pk"), last=Max("pk")).values()
    operator = f.operator_key
    return {
        "tenant: list its endpoints (page 1)": lambda: ("/api/v1/endpoints/", rng.choice(f.tenant_keys)),
        "operator: list endpoints (random page of 200)": lambda: (
            f"/api/v1/endpoints/?page={rng.randint(1, pages)}",
            operator,
        ),
        # The cursor the API's `next` links carry (DRF's: base64 of "p=<id>"), at a random place:
        # a keyset page costs the same anywhere, where ?page=N above reads past N x 50 rows.
        "operator: list endpoints (cursor page at a random place)": lambda: (
            f"/api/v1/endpoints/?cursor={cursor_at(rng.randint(first, last))}",
            operator,
        ),
        "operator: endpoints filtered by gpu_type+state": lambda: (
            "/api/v1/endpoints/?gpu_type=h100-80gb&state=ready",
            operator,
        ),
        "operator: capacity summary (20 pools)": lambda: ("/api/v1/capacity/", operator),
        "operator: events, newest page": lambda: ("/api/v1/events/", operator),
        "operator: list pools": lambda: ("/api/v1/pools/", operator),
        "operator: capacity of one pool": lambda: (f"/api/v1/capacity/{rng.choice(pool_ids)}/", operator),
        "tenant: its usage": lambda: ("/api/v1/usage/", rng.choice(f.tenant_keys)),
        "operator: pods list": lambda: ("/api/v1/pods/", operator),
    }


def cursor_at(endpoint_id: int) -> str:
    return quote(base64.b64encode(f"p={endpoint_id}".encode()).decode())


class Caller(threading.Thread):
    """One of SELLERS clients at once: its own connection with the operator's key, `calls`
    requests one after the other (what `request` says: method, path, JSON body or None), each
    timed; `answered` sees each answer."""

    def __init__(self, key: str, calls: int, start: threading.Barrier):
        super().__init__(daemon=True)
        self.key, self.calls, self.start_line = key, calls, start
        self.times: list[float] = []
        self.answers: Counter[int] = Counter()
        self.unexpected: list[str] = []

    def request(self) -> tuple[str, str, dict[str, Any] | None]:
        return "GET", "/api/v1/pools/", None

    def answered(self, method: str, path: str, status: int, data: bytes) -> None:
        if status != 200:
            self.unexpected.append(f"{method} {path} -> {status}: {data[:200]!r}")

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        self.start_line.wait()
        for _ in range(self.calls):
            method, path, body = self.request()
            payload = json.dumps(body) if body is not None else None
            started = time.perf_counter()
            try:
                conn.request(method, path, body=payload, headers=headers)
                response = conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()  # the server closed a kept-alive connection: once more on a new one
                started = time.perf_counter()
                conn.request(method, path, body=payload, headers=headers)
                response = conn.getresponse()
            data = response.read()
            self.times.append((time.perf_counter() - started) * 1000)
            self.answers[response.status] += 1
            self.answered(method, path, response.status, data)
        conn.close()


class Seller(Caller):
    """A seller: its own endpoints (no two sellers sell the same one), a POST where the endpoint
    has no reservation, else a PATCH raising it by one or two replicas' MU."""

    def __init__(self, key: str, calls: int, start: threading.Barrier, endpoints: list[list[Any]], seed: int):
        super().__init__(key, calls, start)
        self.endpoints, self.rng = endpoints, random.Random(seed)
        self.row: list[Any] = []

    def request(self) -> tuple[str, str, dict[str, Any] | None]:
        self.row = self.rng.choice(self.endpoints)  # [endpoint id, reservation id or None, MU/min]
        endpoint, reservation, mu = self.row
        if reservation is None:
            return (
                "POST",
                "/api/v1/reservations/",
                {"endpoint": endpoint, "mu_per_minute": self.rng.choice([100, 200, 300])},
            )
        return (
            "PATCH",
            f"/api/v1/reservations/{reservation}/",
            {"mu_per_minute": mu + self.rng.choice([100, 200])},
        )

    def answered(self, method: str, path: str, status: int, data: bytes) -> None:
        if status in (200, 201):
            sold = json.loads(data)
            self.row[1], self.row[2] = sold["id"], sold["mu_per_minute"]
        elif status != 409:  # a refusal is an answer; anything else is not
            super().answered(method, path, status, data)


def crowd(make: Callable[[int, int, threading.Barrier], Caller], calls: int) -> list[Caller]:
    """SELLERS callers at once (`make(k, their calls, the start line)`), `calls` in all; done."""
    start = threading.Barrier(SELLERS)
    callers = [make(k, calls // SELLERS + (k < calls % SELLERS), start) for k in range(SELLERS)]
    for c in callers:
        c.start()
    for c in callers:
        c.join()
    for line in [u for c in callers for u in c.unexpected][:3]:
        print(f"    unexpected: {line}")
    return callers


def floor(f: Fleet, calls: int, cpu: CpuMeter) -> Result:
    """What this machine answers SELLERS clients at once with the cheapest authenticated call
    (the pools, 20 rows): the floor under any call at that concurrency, the sale's included."""
    before = cpu.read()
    callers = crowd(lambda k, n, start: Caller(f.operator_key, n, start), calls)
    result = report(
        f"{f.size.label} {FLOOR}", [t for c in callers for t in c.times], SALE_GOAL_MS, own_goal=True
    )
    print(f"    {cpu.per_call(before, calls)}")
    return result


def sale(f: Fleet, sales: int, cpu: CpuMeter) -> Result:
    """SELLERS sellers at once on the nearly full pools' endpoints; then whether any pool is oversold."""
    from controlplane.endpoints.models import Endpoint

    endpoints = [
        list(row)
        for row in Endpoint.objects.filter(pool_id__in=f.full_pool_ids)
        .order_by("pk")
        .values_list("pk", "reservation__pk", "reservation__mu_per_minute")
    ]
    before = cpu.read()
    callers = crowd(
        lambda k, n, start: Seller(f.operator_key, n, start, endpoints[k::SELLERS], 100 + k), sales
    )
    answers = sum((c.answers for c in callers), Counter())
    result = report(
        f"{f.size.label} {SALE}", [t for c in callers for t in c.times], SALE_GOAL_MS, own_goal=True
    )
    print(f"    {cpu.per_call(before, sales)}")
    other = sum(n for status, n in answers.items() if status not in (200, 201, 409))
    made = f"sold {answers[201]} new and raised {answers[200]} (201/200)"
    print(f"    {made}, refused {answers[409]} (409), other {other}")
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    conn.request("GET", "/api/v1/capacity/", headers={"Authorization": f"Bearer {f.operator_key}"})
    pools = json.loads(conn.getresponse().read())
    conn.close()
    oversold = [f"{p['pool']} ({p['unplaced_replicas']} replicas unplaced)" for p in pools
                if p["oversold"] or p["unplaced_replicas"] > 0]  # fmt: skip
    print(
        f"    never oversold: {'NO: ' + ', '.join(oversold) if oversold else 'yes'} ({len(pools)} pools read)"
    )
    return result


def measure(f: Fleet, options: fleet.Options, sales: int, server_kind: str) -> dict[str, Result]:
    rng = random.Random(11)
    scenarios = read_scenarios(f, rng)
    results: dict[str, Result] = {}
    # The clients' own garbage collection out of their timings: the load left this process
    # millions of objects, which a full collection would walk with every client thread stopped.
    gc.collect()
    gc.freeze()
    with tempfile.NamedTemporaryFile(prefix="bench-api-server-", suffix=".log", delete=False) as log:
        server = serve(log, server_kind)
        try:
            for make in scenarios.values():  # warm both workers' connections and caches
                timed_runs(lambda make=make: get(*make()), 10, budget_s=5, least=2)
            header(GOAL_MS)
            for name, make in scenarios.items():
                times = timed_runs(lambda make=make: get(*make()), options.requests, options.budget_s)
                results[name] = report(f"{f.size.label} {name}", times, GOAL_MS)
            if sales:
                cpu = CpuMeter(server)
                results[FLOOR] = floor(f, sales, cpu)
                results[SALE] = sale(f, sales, cpu)
                ratio = (results[SALE].p50 / results[FLOOR].p50, results[SALE].p99 / results[FLOOR].p99)
                print(f"    the sale against the floor: p50 {ratio[0]:.1f}x, p99 {ratio[1]:.1f}x")
        except BaseException:
            print(f"the server's log: {log.name}")
            raise
        finally:
            server.terminate()
            server.wait(timeout=30)
    os.unlink(log.name)
    return results


def own_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sales", type=int, default=400, help="sales in all in the sale scenario, 0: none (%(default)s)"
    )
    parser.add_argument(
        "--server",
        choices=list(SERVERS),
        default="production",
        help="gunicorn as in production (uvicorn workers) or with 2 sync workers (%(default)s)",
    )


def main() -> None:
    options, args = fleet.parse_options(
        __doc__.splitlines()[0], requests=500, extra=own_arguments, smoke={"sales": SELLERS}
    )
    if args.sales < 0:
        raise SystemExit(f"--sales must be at least 0, not {args.sales}")
    print(f"server: {args.server} (gunicorn {' '.join(SERVERS[args.server])})")
    fleet.run_sizes(options, lambda f: measure(f, options, args.sales, args.server))


if __name__ == "__main__":
    fleet.use_project_python()
    main()
