"""The production web server's requests inside Django per worker (WEB_APP_CONCURRENCY), side by side.

    python bench/web_concurrency.py [--endpoints N] [--settings 2,4,16] [--rounds 2] [--requests N]
                                    [--smoke]

Loads the fleet (bench/fleet.py, 10,000 endpoints by default) into a fresh database and serves it
with the production web server (bench/api_latency.py's), once per setting and round, the
settings alternating within each round: a machine that slows during the run slows them alike.
Under each, CLIENTS clients at once, each on its own connection with the operator's key, make
--requests calls in all, twice: like calls (the 20 pools read, api_latency's floor), then a mix
(SLOW of the clients reading a page of 500 endpoints, ~100 ms each, a quarter as many times,
the others the pools). One row per load, call and setting, with p50 and p99 in ms over the
rounds. No goal: it compares.
"""

import argparse
import gc
import os
import tempfile
from collections import defaultdict
from dataclasses import replace

import fleet
from api_latency import SELLERS as CLIENTS
from api_latency import Caller, crowd, serve
from fleet import Fleet, Result, percentiles

SLOW = 4
SLOW_PAGE = "/api/v1/endpoints/?page_size=500"
POOLS = "the 20 pools"
ENDPOINTS = "500 endpoints a page"


class SlowReader(Caller):
    def request(self) -> tuple[str, str, None]:
        return "GET", SLOW_PAGE, None


def play(f: Fleet, slow: int, requests: int) -> dict[str, list[float]]:
    """CLIENTS clients at once (api_latency.crowd), `slow` of them SlowReaders, `requests` calls
    in all; ms by call. A slow call costs about four cheap ones: a quarter as many, so both kinds
    run to the end."""
    callers = crowd(
        lambda k, n, start: (
            SlowReader(f.operator_key, max(1, n // 4), start)
            if k < slow
            else Caller(f.operator_key, n, start)
        ),
        requests,
    )
    times: dict[str, list[float]] = defaultdict(list)
    for c in callers:
        times[ENDPOINTS if isinstance(c, SlowReader) else POOLS] += c.times
    return times


def measure(f: Fleet, settings: list[int], rounds: int, requests: int) -> dict[str, Result]:
    # The clients' own garbage collection out of their timings (as api_latency.measure).
    gc.collect()
    gc.freeze()
    times: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for _ in range(rounds):
        for setting in settings:
            os.environ["WEB_APP_CONCURRENCY"] = str(setting)  # read by serve()'s gunicorn
            with tempfile.NamedTemporaryFile(prefix="bench-web-concurrency-", suffix=".log") as log:
                server = serve(log, "production")
                try:
                    play(f, SLOW, CLIENTS)  # warm both workers' connections and caches
                    for load, slow in (("like calls", 0), ("mixed", SLOW)):
                        for call, ms in play(f, slow, requests).items():
                            times[(load, call, setting)] += ms
                finally:
                    server.terminate()
                    server.wait()
    print(f"\n{'load':<12} {'call':<22} {'per worker':>10} {'n':>6} {'p50 ms':>8} {'p99 ms':>8}")
    results = {}
    for (load, call, setting), ms in sorted(times.items(), key=lambda kv: (kv[0][0] != "like calls", kv[0])):
        r = results[f"{load}, {call}, {setting} per worker"] = percentiles(ms)
        print(f"{load:<12} {call:<22} {setting:>10} {r.n:>6} {r.p50:>8.1f} {r.p99:>8.1f}", flush=True)
    return results


def own_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--settings", default="2,4,16", help="WEB_APP_CONCURRENCY values (%(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every setting (%(default)s)")


def main() -> None:
    options, args = fleet.parse_options(
        __doc__.splitlines()[0],
        requests=1600,
        extra=own_arguments,
        smoke={"settings": "2,4", "rounds": 1},
    )
    try:
        settings = [int(s) for s in args.settings.split(",")]
    except ValueError:
        raise SystemExit(f"--settings must be integers, comma-separated, not {args.settings!r}") from None
    if not settings or min(settings) < 1 or args.rounds < 1:
        raise SystemExit("--settings must each be at least 1, and --rounds at least 1")
    if args.endpoints is None and args.sizes == f"{fleet.BASE.endpoints},{fleet.LARGE.endpoints}":
        options = replace(options, sizes=[fleet.BASE])  # one size unless named: not about the fleet
    fleet.run_sizes(options, lambda f: measure(f, settings, args.rounds, options.requests))


if __name__ == "__main__":
    fleet.use_project_python()
    main()
