"""What an endpoint version runs in the cluster: one deployment per version, named ep-{id}-v{version}.

Locally the pods run the simulated engine standing in for the profile's GPU type; the
Kubernetes driver maps the same Deployment onto a real one. With ENDPOINT_POD_ENGINE=vllm they
run vLLM on the profile's model instead, one replica on `gpus_per_replica` GPUs of one node:
its tensor-parallel size is the profile's GPUs, which is also what the pod's `nvidia.com/gpu`
limit asks (dataplane.cluster.k8s_objects.gpus_of reads it back), so the pod takes on a node
exactly the GPUs the ledger packed for the replica. The simulated engine asks for no GPUs.

What the pods serve is what routers hold requests to (``context_length``, ``max_token_bytes``):
the context of the engine they run, which the profile's ``max_model_len`` may only lower.
"""

import re
import shlex

from django.conf import settings

from controlplane.capacity.models import ModelProfile
from controlplane.endpoints import pod_keys
from controlplane.endpoints.models import Endpoint
from dataplane.cluster.driver import Deployment
from dataplane.cluster.k8s_objects import PARALLEL_FLAGS, gpus_of

DEPLOYMENT_PREFIX = "ep-"
DEPLOYMENT_NAME = re.compile(r"ep-(\d+)-v(\d+)")
BENCHMARK_PREFIX = "bench-"  # a benchmark's own engine (controlplane.profile_benchmarks); never routed to


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
    served name (the name it was created under: a rename changes nothing here, so restarts no
    pod); `replicas` of them (a rollout's version: its share), else the endpoint's desired ones."""
    profile = profile or endpoint.profile
    version = endpoint.version if version is None else version
    labels = {"endpoint": str(endpoint.pk), "version": str(version), "tenant": endpoint.tenant.name}
    name = deployment_name(endpoint.pk, version)
    events_key = pod_keys.events_key(endpoint.pk)  # its pods' events, and nothing else
    replicas = endpoint.desired_replicas if replicas is None else replicas
    # a row bulk-created without one (benchmarks): its name, which routers then take it to serve
    served = endpoint.served_model_name or endpoint.name
    if settings.ENDPOINT_POD_ENGINE == "vllm":
        args = vllm_args(
            profile.model,
            profile.gpus_per_replica,
            served,
            tuple(shlex.split(settings.ENDPOINT_VLLM_ARGS)),
        )
        return Deployment(
            name, replicas, "vllm", args, endpoint.target_concurrency_per_replica, labels, events_key
        )
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
            served,
        ),
        endpoint.target_concurrency_per_replica,
        labels,
        events_key,
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


def context_length(profile: ModelProfile) -> int:
    """The context (prompt + output tokens) an endpoint's pods on `profile` serve: the profile's
    `max_model_len`, or less where their engine serves less, the simulated profile's own or
    vLLM's `--max-model-len` among ENDPOINT_VLLM_ARGS (without it vLLM serves the model's own,
    which only the profile says). The simulated h100-llama-8b under a profile that says nothing
    (1,048,576) -> 8,192."""
    if settings.ENDPOINT_POD_ENGINE == "vllm":
        served = max_model_len_arg(tuple(shlex.split(settings.ENDPOINT_VLLM_ARGS)))
    else:
        from engine_model.profiles import PROFILES

        engine = PROFILES.get(profile.engine_profile())
        served = engine.max_model_len if engine is not None else None
    return profile.max_model_len if served is None else min(profile.max_model_len, served)


def max_token_bytes() -> int:
    """The most UTF-8 bytes of text one token of the endpoints' engine holds: 4 on the simulated
    engine; 0 (not known) for vLLM, whose tokenizer is the model's."""
    if settings.ENDPOINT_POD_ENGINE == "vllm":
        return 0
    from dataplane.runtime.sim_tokenizer import MAX_BYTES_PER_TOKEN

    return MAX_BYTES_PER_TOKEN


_COUNT = re.compile(r"(\d+(?:\.\d+)?)([kmgKMG]?)")
_MULTIPLIERS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}


def max_model_len_arg(args: tuple[str, ...]) -> int | None:
    """vLLM's `--max-model-len` among a pod's arguments, the last given (as argparse reads
    them), in vLLM's spellings (8192; 8k = 8,000; 8K = 8,192; `--max_model_len=...`); None
    when absent or not a count ("auto", -1: vLLM fits the context to memory)."""
    found = None
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag.replace("_", "-") == "--max-model-len":
            found = value if eq else (args[i + 1] if i + 1 < len(args) else "")
    match = _COUNT.fullmatch(found or "")
    if match is None:
        return None
    count = float(match[1]) * _MULTIPLIERS[match[2]]
    return int(count) if count >= 1 else None


def benchmark_deployment_name(profile_id: int) -> str:
    return f"{BENCHMARK_PREFIX}{profile_id}"
