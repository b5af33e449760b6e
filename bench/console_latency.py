"""Console server time per page at fleet scale, at 10,000 and at 100,000 endpoints, on PostgreSQL.

    make bench-console    (or: python bench/console_latency.py [--sizes 10000,100000 | --endpoints N]
                                                               [--requests N] [--budget-s S]
                                                               [--smoke])

Per size, loads the fleet (bench/fleet.py) into a fresh database and renders each page in-process
through Django's full request stack (middleware, session, views, templates, PostgreSQL; DEBUG
off): one row per page, p50 and p99 server time against the 150 ms goal, then the p99 ratio
between the sizes per page. Prints figures; asserts nothing (this machine is shared and noisy).
"""

import gc
import random
import time
from typing import Any

import fleet
from fleet import Fleet, Result, header, report, timed_runs

GOAL_MS = 150.0


def measure(f: Fleet, options: fleet.Options) -> dict[str, Result]:
    from django.contrib.auth.models import User
    from django.test import Client

    from controlplane.endpoints.models import Endpoint
    from controlplane.oncall.models import Event
    from controlplane.tenants.models import Member, Tenant

    def client_for(name: str, tenant: Tenant | None = None) -> Client:
        user = User.objects.create_user(name, password="bench")
        Member.objects.create(user=user, tenant=tenant, is_operator=tenant is None)
        client = Client()
        client.force_login(user)
        return client

    operator = client_for("bench-ops")
    tenant = client_for("bench-tenant", Tenant.objects.get(name=f"tenant-{7 % f.size.tenants}"))
    rng = random.Random(3)
    ids = list(Endpoint.objects.values_list("pk", flat=True))
    newest = Event.objects.order_by("-id").values_list("id", flat=True).first()
    pages = max(1, f.size.endpoints // 50)
    scenarios: dict[str, tuple[Client, Any]] = {
        "capacity (20 pools, hour chart)": (operator, lambda: "/console/capacity/"),
        "capacity (week chart)": (operator, lambda: "/console/capacity/?window=week"),
        "endpoints, operator, random page of 200": (
            operator,
            lambda: f"/console/endpoints/?page={rng.randint(1, pages)}",
        ),
        "endpoints, operator, next page (page 2)": (operator, lambda: "/console/endpoints/?page=2"),
        "endpoints, filtered by gpu_type + state + search": (
            operator,
            lambda: "/console/endpoints/?gpu_type=h100-80gb&state=ready&search=endpoint-1",
        ),
        "endpoints, a tenant's own": (tenant, lambda: "/console/endpoints/"),
        "endpoint detail": (operator, lambda: f"/console/endpoints/{rng.choice(ids)}/"),
        "endpoint detail, with an hour of load buckets": (
            operator,
            lambda: f"/console/endpoints/{rng.choice(f.load_sampled)}/",
        ),
        "on-call, operator (100k events)": (operator, lambda: "/console/oncall/"),
        "on-call, critical hangs filter": (operator, lambda: "/console/oncall/?severity=critical&kind=hang"),
        "on-call tail poll (nothing new)": (operator, lambda: f"/console/oncall/tail/?after={newest}"),
        "on-call, a tenant's": (tenant, lambda: "/console/oncall/"),
    }

    def timed(client: Client, path: str) -> float:
        started = time.perf_counter()
        response = client.get(path)
        elapsed = (time.perf_counter() - started) * 1000
        if response.status_code != 200:
            raise RuntimeError(f"GET {path} -> {response.status_code}")
        return elapsed

    for client, make in scenarios.values():  # warm caches and connections
        timed_runs(lambda client=client, make=make: timed(client, make()), 5, budget_s=5, least=1)
    gc.collect()  # as a production worker does once the app is loaded (controlplane/gunicorn.conf.py)
    gc.freeze()
    header(GOAL_MS)
    results = {}
    for name, (client, make) in scenarios.items():
        times = timed_runs(
            lambda client=client, make=make: timed(client, make()), options.requests, options.budget_s
        )
        results[name] = report(f"{f.size.label} {name}", times, GOAL_MS)
    return results


def main() -> None:
    options, _ = fleet.parse_options(__doc__.splitlines()[0], requests=200)
    fleet.run_sizes(options, lambda f: measure(f, options))


if __name__ == "__main__":
    fleet.use_project_python()
    main()
