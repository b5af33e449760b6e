"""A small demo fleet: GPU types, pools, model profiles, two tenants, endpoints, reservations.

Idempotent: a second run finds the fleet and changes nothing. Coefficients are hand-set
placeholders (source=manual) until the benchmarks fit real ones; each model x GPU pair names the
simulated engine profile (engine_model.profiles, where its numbers are derived) that its
benchmark and its local pods run where no GPU can be had.
"""

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from controlplane.capacity.models import GpuPool, GpuType, ModelProfile
from controlplane.endpoints.models import Endpoint
from controlplane.oncall.models import Event
from controlplane.selling import save_endpoint, sell
from controlplane.tenants.models import ApiKey, Tenant

GPU_TYPES = [("h100-80gb", 80, "2.4900"), ("l40s-48gb", 48, "0.9900")]
POOLS = [
    ("us-east-h100", "h100-80gb", "us-east-1", "use1-a", 64),
    ("eu-west-h100", "h100-80gb", "eu-west-1", "euw1-a", 32),
    ("us-east-l40s", "l40s-48gb", "us-east-1", "use1-b", 48),
]
# model, gpu type, alpha, beta, gamma (MU per input token, per output token, per request),
# GPUs/replica, simulated engine profile
PROFILES = [
    ("llama-3.1-8b-instruct", "h100-80gb", 0.0004, 0.004, 0.02, 1, "h100-llama-8b"),
    ("llama-3.1-8b-instruct", "l40s-48gb", 0.001, 0.01, 0.05, 1, "l40s-llama-8b"),
    ("llama-3.1-70b-instruct", "h100-80gb", 0.002, 0.02, 0.1, 4, "h100x4-llama-70b"),
]
# tenant, endpoint, model, gpu type, min/max provisioned concurrency, scale to zero, reserved MU/min
# (each endpoint's maximum replicas fit its pool, and each tenant's the fleet: its default quota)
ENDPOINTS = [
    ("acme", "chat", "llama-3.1-70b-instruct", "h100-80gb", 16, 128, False, 800),
    ("acme", "summarize", "llama-3.1-8b-instruct", "h100-80gb", 8, 128, False, 1200),
    ("acme", "batch-tagging", "llama-3.1-8b-instruct", "l40s-48gb", 0, 64, True, 0),
    ("globex", "assistant", "llama-3.1-8b-instruct", "h100-80gb", 4, 64, True, 600),
    ("globex", "search-rerank", "llama-3.1-8b-instruct", "l40s-48gb", 8, 96, False, 1500),
]


class Command(BaseCommand):
    help = "Load the demo fleet (idempotent); prints new API keys when it creates tenants."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--write-keys",
            metavar="DIR",
            help="also write the new keys to DIR/operator.key, DIR/acme.key, ... (mode 600), "
            "for the local stack's router and load generator",
        )

    @transaction.atomic
    def handle(self, **options: Any) -> None:
        if Tenant.objects.filter(name="acme").exists():
            self.stdout.write("Demo fleet already loaded.")
            return
        types = {
            name: GpuType.objects.create(name=name, memory_gib=mem, hourly_cost_usd=cost)
            for name, mem, cost in GPU_TYPES
        }
        pools = {
            name: GpuPool.objects.create(
                name=name, gpu_type=types[gpu], region=region, cluster=cluster, gpu_count=count
            )
            for name, gpu, region, cluster, count in POOLS
        }
        profiles = {
            (model, gpu): ModelProfile.objects.create(
                model=model,
                gpu_type=types[gpu],
                alpha=a,
                beta=b,
                gamma=g,
                gpus_per_replica=gpr,
                simulated_profile=simulated,
            )
            for model, gpu, a, b, g, gpr, simulated in PROFILES
        }
        tenants = {name: Tenant.objects.create(name=name) for name in ("acme", "globex")}
        for tenant, name, model, gpu, low, high, to_zero, reserved in ENDPOINTS:
            profile = profiles[(model, gpu)]
            endpoint = Endpoint(
                tenant=tenants[tenant],
                name=name,
                profile=profile,
                pool=next(p for p in pools.values() if p.gpu_type == types[gpu]),
                min_provisioned_concurrency=low,
                max_provisioned_concurrency=high,
                scale_to_zero_enabled=to_zero,
                target_concurrency_per_replica=8,
            )
            save_endpoint(endpoint)
            if reserved:
                sell(endpoint, mu_per_minute=reserved, best_effort_allowed=True, sold_by="demo")
        # On-call's first line: a fact of this fleet, on no pod (the pods' own events, hangs and
        # restarts, come from the pods the local cluster starts: `make load` and a fault show them).
        Event.record(
            Event.Kind.ENDPOINT,
            f"demo fleet loaded: {len(ENDPOINTS)} endpoints of {len(tenants)} tenants in {len(POOLS)} pools",
            reported_by="demo",
        )
        _, operator = ApiKey.issue(name="demo-operator", tenant=None)
        keys = {name: ApiKey.issue(name=f"{name}-demo", tenant=t)[1] for name, t in tenants.items()}
        keys = {"operator": operator, **keys}
        if options.get("write_keys"):
            folder = Path(options["write_keys"])
            folder.mkdir(parents=True, exist_ok=True)
            for name, secret in keys.items():
                path = folder / f"{name}.key"
                path.touch(mode=0o600)
                path.write_text(secret + "\n")
        self.stdout.write("Demo fleet loaded. API keys (shown once):")
        for name, secret in keys.items():
            self.stdout.write(f"  {name}: {secret}")
