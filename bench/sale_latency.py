"""A sale's own cost at fleet scale: `selling.sell` in process, at 10,000 and at 100,000 endpoints.

    python bench/sale_latency.py [--sizes 10000,100000 | --endpoints N] [--requests N] [--smoke]

Per size, loads the fleet (bench/fleet.py) into a fresh database and sells on random endpoints
of the 4 nearly full pools, one sale at a time, each in a transaction rolled back (every sale
meets the same pool): 100-600 MU/min, which fit, or 20,000, which does not (409). One row each
for the sales made and the refusals, with p50 and p99 in ms: the time a sale holds its pool's
lock and a core, without the web server's (bench/api_latency.py measures the sale through it).
No goal: run it from another commit's worktree on the same machine to compare.
"""

import random
import time

import fleet
from fleet import Fleet, Result, percentiles


def measure(f: Fleet, requests: int) -> dict[str, Result]:
    from django.db import transaction

    from capacity.ledger import Oversold
    from controlplane import selling
    from controlplane.endpoints.models import Endpoint

    endpoints = list(
        Endpoint.objects.filter(pool_id__in=f.full_pool_ids).select_related("profile", "pool", "tenant")
    )
    rng = random.Random(3)
    times: dict[str, list[float]] = {"sold": [], "refused (409)": []}
    for endpoint in (rng.choice(endpoints) for _ in range(requests)):
        with transaction.atomic():
            started = time.perf_counter()
            try:
                selling.sell(
                    endpoint,
                    mu_per_minute=rng.choice([100, 300, 600, 20_000]),
                    best_effort_allowed=True,
                    sold_by="bench",
                )
                kind = "sold"
            except Oversold:
                kind = "refused (409)"
            times[kind].append((time.perf_counter() - started) * 1000)
            transaction.set_rollback(True)
    print(f"\n{'in process':<64} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}", flush=True)
    results = {}
    for kind, ms in times.items():
        if ms:
            r = results[f"sale, {kind}"] = percentiles(ms)
            print(f"{f.size.label + ' sale, ' + kind:<64} {r.n:>5} {r.p50:>8.2f} {r.p99:>8.2f}", flush=True)
    return results


def main() -> None:
    options, _ = fleet.parse_options(__doc__.splitlines()[0], requests=300)
    fleet.run_sizes(options, lambda f: measure(f, options.requests))


if __name__ == "__main__":
    fleet.use_project_python()
    main()
