"""Console server time per page at fleet scale: 10,000 endpoints, 100,000 events, 57,600 snapshots.

    make bench-console        (or: .venv/bin/python bench/console_latency.py [--requests N])

Renders each page in-process through Django's full request stack (middleware, session, views,
templates, PostgreSQL; DEBUG off) and prints p50/p99 server time against the 150 ms goal.
Prints figures; asserts nothing (this machine is shared and noisy).
"""

import argparse
import random
import time

from fleet import ENDPOINTS, header, load, recreate_database, report

GOAL_MS = 150.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per page")
    args = parser.parse_args()
    recreate_database()
    started = time.monotonic()
    load()
    print(f"loaded in {time.monotonic() - started:.1f} s")

    from django.contrib.auth.models import User
    from django.test import Client

    from controlplane.endpoints.models import Endpoint
    from controlplane.oncall.models import Event
    from controlplane.tenants.models import Member, Tenant

    def client_for(name, tenant=None):
        user = User.objects.create_user(name, password="bench")
        Member.objects.create(user=user, tenant=tenant, is_operator=tenant is None)
        client = Client()
        client.force_login(user)
        return client

    operator = client_for("bench-ops")
    tenant = client_for("bench-tenant", Tenant.objects.get(name="tenant-7"))
    rng = random.Random(3)
    ids = list(Endpoint.objects.values_list("pk", flat=True))
    newest = Event.objects.order_by("-id").values_list("id", flat=True).first()
    pages = {
        "capacity (20 pools, hour chart)": (operator, lambda: "/console/capacity/"),
        "capacity (week chart)": (operator, lambda: "/console/capacity/?window=week"),
        "endpoints, operator, random page of 200": (
            operator,
            lambda: f"/console/endpoints/?page={rng.randint(1, ENDPOINTS // 50)}",
        ),
        "endpoints, filtered by gpu_type + state + search": (
            operator,
            lambda: "/console/endpoints/?gpu_type=h100-80gb&state=ready&search=endpoint-1",
        ),
        "endpoints, a tenant's own": (tenant, lambda: "/console/endpoints/"),
        "endpoint detail": (operator, lambda: f"/console/endpoints/{rng.choice(ids)}/"),
        "on-call, operator (100k events)": (operator, lambda: "/console/oncall/"),
        "on-call, critical hangs filter": (operator, lambda: "/console/oncall/?severity=critical&kind=hang"),
        "on-call tail poll (nothing new)": (operator, lambda: f"/console/oncall/tail/?after={newest}"),
        "on-call, a tenant's": (tenant, lambda: "/console/oncall/"),
    }

    def timed(client, path):
        started = time.perf_counter()
        response = client.get(path)
        elapsed = (time.perf_counter() - started) * 1000
        if response.status_code != 200:
            raise RuntimeError(f"GET {path} -> {response.status_code}")
        return elapsed

    for client, make in pages.values():  # warm caches and connections
        for _ in range(5):
            timed(client, make())
    header(GOAL_MS)
    for name, (client, make) in pages.items():
        report(name, [timed(client, make()) for _ in range(args.requests)], GOAL_MS)


if __name__ == "__main__":
    main()
