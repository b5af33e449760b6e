"""What an endpoint version runs in the cluster: one deployment per version, named ep-{id}-v{version}.

Locally the pods run the simulated engine standing in for the profile's GPU type; the
Kubernetes driver maps the same Deployment onto a real one.
"""

import re
import shlex
from datetime import datetime, timedelta

from django.conf import settings

from controlplane.capacity.models import ModelProfile
from controlplane.endpoints.models import Endpoint
from dataplane.cluster.driver import Deployment

DEPLOYMENT_PREFIX = "ep-"
DEPLOYMENT_NAME = re.compile(r"ep-(\d+)-v(\d+)")
BENCHMARK_PREFIX = (
    "bench-"  # a benchmark's own engine (controlplane.capacity.profile_benchmarks); never routed to
)


def deployment_name(endpoint_id: int, version: int) -> str:
    return f"{DEPLOYMENT_PREFIX}{endpoint_id}-v{version}"


def parse_deployment(name: str) -> tuple[int, int] | None:
    """'ep-42-v3' -> (42, 3): the endpoint and version a deployment of ours runs; else None."""
    match = DEPLOYMENT_NAME.fullmatch(name)
    return (int(match[1]), int(match[2])) if match else None


def deployment(
    endpoint: Endpoint, version: int | None = None, profile: ModelProfile | None = None
) -> Deployment:
    """An endpoint version's pods: its simulated engine profile, served under the endpoint's name."""
    profile = profile or endpoint.profile
    version = endpoint.version if version is None else version
    return Deployment(
        deployment_name(endpoint.pk, version),
        endpoint.desired_replicas,
        "sim",
        (
            "--profile",
            profile.engine_profile(),
            "--time-scale",
            str(settings.LOCAL_POD_TIME_SCALE),
            "--served-model-name",
            endpoint.name,
        ),
        endpoint.target_concurrency_per_replica,
        {"endpoint": str(endpoint.pk), "version": str(version), "tenant": endpoint.tenant.name},
    )


def sim_profile(gpu_type: str) -> str:
    """The simulated engine profile standing in for a GPU type (h100 unless named)."""
    from dataplane.runtime.profiles import PROFILES

    name = gpu_type.lower()
    return next((p for p in sorted(PROFILES) if p.split("-")[0] in name), "h100-llama-8b")


def _benchmark_sim_profile(profile: ModelProfile) -> str:
    from controlplane.capacity.profile_benchmarks import simulated_profile_name

    return simulated_profile_name(profile) or profile.engine_profile()


def benchmark_deployment_name(profile_id: int) -> str:
    return f"{BENCHMARK_PREFIX}{profile_id}"


def benchmark_deployment(profile: ModelProfile) -> Deployment:
    """The engine a benchmark of `profile` measures (BENCHMARK_POD_ENGINE): one replica."""
    if settings.BENCHMARK_POD_ENGINE == "vllm":
        engine = "vllm"
        args: tuple[str, ...] = ("--model", settings.BENCHMARK_VLLM_MODEL or profile.model)
        if settings.BENCHMARK_VLLM_PYTHON:
            args += ("--vllm-python", settings.BENCHMARK_VLLM_PYTHON)
        args += tuple(shlex.split(settings.BENCHMARK_VLLM_ARGS))
    else:
        engine = "sim"
        args = (
            "--profile",
            _benchmark_sim_profile(profile),
            "--time-scale",
            str(settings.BENCHMARK_SIMULATED_TIME_SCALE),
        )
    name = benchmark_deployment_name(profile.pk)
    return Deployment(name, 1, engine, args, 1, {"benchmark": str(profile.pk)})


def benchmark_deployments(now: datetime) -> list[Deployment]:
    """A deployment for every benchmark under way that needs an engine of its own."""
    if settings.BENCHMARK_ENGINE_URL:
        return []
    live = now - timedelta(seconds=settings.BENCHMARK_CLAIM_TTL_S)
    claimed = ModelProfile.objects.filter(benchmark_claimed_at__gt=live).select_related("gpu_type")
    from controlplane.capacity.profile_benchmarks import runs_in_process

    # A benchmark on the virtual clock runs in-process: it needs no pod.
    return [benchmark_deployment(p) for p in claimed.order_by("id") if not runs_in_process(p)]
