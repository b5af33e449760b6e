"""An endpoint's runtime pod asks for its profile's GPUs on one node: vLLM runs with
--tensor-parallel-size = gpus_per_replica and the Deployment's nvidia.com/gpu limit is the same
number (what the ledger packed for one replica); the simulated engine asks for no GPUs."""

import kubernetes_validate
import pytest

from controlplane.endpoints.deployments import deployment, vllm_args
from controlplane.profile_benchmarks import benchmark_deployment
from dataplane.cluster.k8s_objects import GPU_RESOURCE, RuntimePodConfig, deployment_manifest
from dataplane.runtime.pod import parse_args

KUBERNETES_VERSION = "1.32.0"


def container(manifest):
    (c,) = manifest["spec"]["template"]["spec"]["containers"]
    return c


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_a_vllm_endpoint_asks_its_profiles_gpus(settings, make_endpoint, owner, h100, gpus):
    from controlplane.capacity.models import GpuPool, ModelProfile

    settings.ENDPOINT_POD_ENGINE = "vllm"
    settings.ENDPOINT_VLLM_ARGS = "--max-num-seqs 64 -- --gpu-memory-utilization 0.9"
    pool = GpuPool.objects.create(name="p8", gpu_type=h100, gpu_count=16, gpus_per_node=8)
    profile = ModelProfile.objects.create(
        model=f"org/tp{gpus}", gpu_type=h100, alpha=0, beta=0, gamma=1, gpus_per_replica=gpus
    )
    endpoint = make_endpoint(owner, "chat", profile=profile, pool=pool)
    d = deployment(endpoint)
    manifest = deployment_manifest(d, RuntimePodConfig())
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    c = container(manifest)
    assert c["resources"]["limits"][GPU_RESOURCE] == str(gpus)
    assert c["image"] == RuntimePodConfig().vllm_image
    # The pod's own parser takes them: our flags before "--", vLLM's (the TP size) after.
    ours, passed_to_vllm = parse_args(["--engine", "vllm", "--port", "8000", "--probe-port", "8001", *d.args])
    assert (ours.model, ours.served_model_name, ours.max_num_seqs) == (f"org/tp{gpus}", "chat", 64)
    assert passed_to_vllm == ["--gpu-memory-utilization", "0.9", "--tensor-parallel-size", str(gpus)]


def test_a_simulated_endpoint_asks_no_gpus(make_endpoint, owner, big_model):
    endpoint = make_endpoint(owner, "sim", profile=big_model)
    d = deployment(endpoint)
    assert d.engine == "sim" and "--tensor-parallel-size" not in d.args
    limits = container(deployment_manifest(d, RuntimePodConfig()))["resources"]["limits"]
    assert GPU_RESOURCE not in limits


def test_the_tensor_parallel_size_goes_after_the_separator():
    assert vllm_args("m", 4) == ("--model", "m", "--", "--tensor-parallel-size", "4")
    assert vllm_args("m", 2, "chat", ("--", "--enforce-eager")) == (
        "--model", "m", "--served-model-name", "chat", "--", "--enforce-eager", "--tensor-parallel-size", "2",
    )  # fmt: skip


def test_parallel_sizes_named_in_the_extra_args_must_match_the_profile():
    # tp 2 x pp 2 = 4 GPUs on one node: the profile's 4, kept as given.
    args = vllm_args("m", 4, extra=("--", "-tp", "2", "--pipeline-parallel-size=2"))
    assert args[-3:] == ("-tp", "2", "--pipeline-parallel-size=2") and "--tensor-parallel-size" not in args
    with pytest.raises(ValueError, match="ask 2 GPUs per replica; the profile of m has 8"):
        vllm_args("m", 8, extra=("--", "--tensor-parallel-size", "2"))


def test_a_vllm_benchmark_pod_takes_the_profiles_gpus(settings, big_model):
    settings.BENCHMARK_POD_ENGINE = "vllm"
    settings.BENCHMARK_VLLM_ARGS = "--max-num-seqs 16"
    d = benchmark_deployment(big_model)
    assert d.args == (
        "--model", "llama-70b", "--max-num-seqs", "16",
        "--", "--tensor-parallel-size", "4",
    )  # fmt: skip
    limits = container(deployment_manifest(d, RuntimePodConfig()))["resources"]["limits"]
    assert limits[GPU_RESOURCE] == "4"
