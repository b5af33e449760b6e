"""What an endpoint version runs in the cluster: one deployment per version, named ep-{id}-v{version}.

Locally the pods run the simulated engine standing in for the profile's GPU type; the
Kubernetes driver maps the same Deployment onto a real one. With ENDPOINT_POD_ENGINE=vllm they
run vLLM on the profile's model instead, one replica on `gpus_per_replica` GPUs of one node:
its tensor-parallel size is the profile's GPUs, which is also what the pod's `nvidia.com/gpu`
limit asks (dataplane.cluster.k8s_objects.gpus_of reads it back), so the pod takes on a node
exactly the GPUs the ledger packed for the replica. The simulated engine asks for no GPUs.
"""

import re
import shlex
from datetime import datetime, timedelta

from django.conf import settings

from controlplane.capacity.models import ModelProfile
from controlplane.endpoints.models import Endpoint
from dataplane.cluster.driver import Deployment
from dataplane.cluster.k8s_objects import PARALLEL_FLAGS, gpus_of

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
    endpoint: Endpoint,
    version: int | None = None,
    profile: ModelProfile | None = None,
    replicas: int | None = None,
) -> Deployment:
    """An endpoint version's pods: its simulated engine profile, served under the endpoint's
    name; `replicas` of them (a rollout's version: its share), else the endpoint's desired ones."""
    profile = profile or endpoint.profile
    version = endpoint.version if version is None else version
    labels = {"endpoint": str(endpoint.pk), "version": str(version), "tenant": endpoint.tenant.name}
    name = deployment_name(endpoint.pk, version)
    replicas = endpoint.desired_replicas if replicas is None else replicas
    if settings.ENDPOINT_POD_ENGINE == "vllm":
        args = vllm_args(
            profile.model,
            profile.gpus_per_replica,
            endpoint.name,
            tuple(shlex.split(settings.ENDPOINT_VLLM_ARGS)),
        )
        return Deployment(name, replicas, "vllm", args, endpoint.target_concurrency_per_replica, labels)
    return Deployment(
        name,
        replicas,
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
        labels,
    )


def vllm_args(
    model: str, gpus_per_replica: int, served_model_name: str = "", extra: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """The pod's arguments for a vLLM replica of `gpus_per_replica` GPUs: `--model`, then
    `extra` (the pod's own flags, then after `--` vLLM's), then `--tensor-parallel-size` as a
    vLLM flag. ("m", 4) -> (--model m -- --tensor-parallel-size 4). `extra` that names its own
    tensor or pipeline size must multiply to `gpus_per_replica` (ValueError otherwise): the
    ledger packed that many GPUs on one node for the replica."""
    args = ("--model", model, *(("--served-model-name", served_model_name) if served_model_name else ()))
    args += extra
    if any(arg.partition("=")[0] in PARALLEL_FLAGS for arg in extra):
        if gpus_of(args) != gpus_per_replica:
            raise ValueError(
                f"vLLM arguments {' '.join(extra)!r} ask {gpus_of(args)} GPUs per replica; the"
                f" profile of {model} has {gpus_per_replica}"
            )
        return args
    return args + ((() if "--" in args else ("--",)) + ("--tensor-parallel-size", str(gpus_per_replica)))


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
        python = ("--vllm-python", settings.BENCHMARK_VLLM_PYTHON) if settings.BENCHMARK_VLLM_PYTHON else ()
        args: tuple[str, ...] = vllm_args(
            settings.BENCHMARK_VLLM_MODEL or profile.model,
            profile.gpus_per_replica,
            extra=(*python, *shlex.split(settings.BENCHMARK_VLLM_ARGS)),
        )
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
