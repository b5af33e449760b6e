"""The cluster driver the control plane runs its pods through, from the settings: the local
agent's (CLUSTER_DRIVER=local), Kubernetes' (one per process and configuration, with the runtime
pods' images, namespace and events endpoint from the settings), or none. The autoscaler's passes
(controlplane.scaling), the pod mirror and wake (controlplane.pods), the benchmarks and their
Celery tasks take the driver from here.
"""

from __future__ import annotations

import functools

from django.conf import settings

from dataplane.cluster.driver import ClusterDriver
from dataplane.cluster.k8s_objects import RuntimePodConfig


def driver() -> ClusterDriver | None:
    """The configured cluster driver; None when the control plane runs no pods (CLUSTER_DRIVER=none)."""
    if settings.CLUSTER_DRIVER == "local":
        from dataplane.cluster.local import LocalDriver

        return LocalDriver(settings.CLUSTER_AGENT_URL, settings.CLUSTER_AGENT_TOKEN_FILE)
    if settings.CLUSTER_DRIVER == "kubernetes":
        return kubernetes_driver(runtime_pod_config())
    return None


@functools.cache
def kubernetes_driver(config: RuntimePodConfig) -> ClusterDriver:
    """One per process and configuration: it keeps its API connections and the hashes of what
    it applied, so that the passes' unchanged declarations cost no API call."""
    from dataplane.cluster.kubernetes import KubernetesDriver

    return KubernetesDriver(config)


def runtime_pod_config() -> RuntimePodConfig:
    return RuntimePodConfig(
        namespace=settings.KUBERNETES_NAMESPACE,
        sim_image=settings.RUNTIME_SIM_IMAGE,
        vllm_image=settings.RUNTIME_VLLM_IMAGE,
        image_pull_policy=settings.RUNTIME_IMAGE_PULL_POLICY,
        events_url=settings.RUNTIME_EVENTS_URL,
        fleet_key_secret=settings.RUNTIME_FLEET_KEY_SECRET,
    )
