"""The control plane on Kubernetes, against the stand-in API server: CLUSTER_DRIVER=kubernetes
gives the autoscaler one Kubernetes driver per process, a pass declares every endpoint's
Deployment, the pod mirror reads readiness back, and `manage.py watch_pods` records restarts
as on-call events."""

import os
import signal
import threading
import time
from datetime import UTC, datetime

import pytest
from django.core.management import call_command
from django.db import connection

from controlplane import drivers, pods, scaling
from controlplane.endpoints.models import Endpoint, Pod
from controlplane.oncall.models import Event
from controlplane.selling import save_endpoint
from dataplane.cluster.driver import ClusterError
from dataplane.cluster.kubernetes import KubernetesDriver
from dataplane.wire.pod_events import PodEvent
from tests.cluster.kube_standin import pod, write_kubeconfig

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def kube(standin, monkeypatch, tmp_path, settings):
    """The stand-in as the current kubeconfig's cluster, and CLUSTER_DRIVER=kubernetes."""
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", standin.url)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings.CLUSTER_DRIVER = "kubernetes"
    settings.KUBERNETES_NAMESPACE = "mu-runtime"
    settings.RUNTIME_SIM_IMAGE = "mu/runtime-sim:dev"
    settings.RUNTIME_EVENTS_URL = "http://controlplane.mu-system.svc"
    drivers.kubernetes_driver.cache_clear()
    yield standin
    drivers.kubernetes_driver.cache_clear()


def test_one_kubernetes_driver_per_process_from_the_settings(kube):
    first = drivers.driver()
    assert isinstance(first, KubernetesDriver) and drivers.driver() is first
    assert first.config.sim_image == "mu/runtime-sim:dev" and first.namespace == "mu-runtime"


def test_no_kubernetes_configuration_is_a_cluster_error(kube, monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(ClusterError, match="no Kubernetes configuration"):
        drivers.driver()


def test_a_pass_declares_every_endpoint_and_the_mirror_reads_readiness_back(kube, owner, make_endpoint):
    chat = make_endpoint(owner, "chat", min_provisioned_concurrency=16)  # 2 replicas at 8 each
    name = f"ep-{chat.pk}-v1"
    cluster = drivers.driver()
    scaling.horizontal_pass(cluster, NOW)
    assert kube.names("deployments") == [name] and kube.names("services") == [name]
    d = kube.get("deployments", name)
    assert d["spec"]["replicas"] == 2
    assert d["metadata"]["labels"]["mu/endpoint"] == str(chat.pk)
    assert d["metadata"]["annotations"] == {"mu/target-concurrency": "8"}
    (container,) = d["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "mu/runtime-sim:dev"
    assert container["args"][container["args"].index("--served-model-name") + 1] == "chat"
    kube.put("pods", pod(f"{name}-a", deployment=name, endpoint=str(chat.pk), ip="10.1.0.7"))
    kube.put("pods", pod(f"{name}-b", deployment=name, endpoint=str(chat.pk), ip="10.1.0.8", ready=False))
    pods.sync_pods(cluster)
    rows = {p.name: (p.url, p.ready) for p in Pod.objects.filter(endpoint=chat)}
    assert rows == {f"{name}-a": ("http://10.1.0.7:8000", True), f"{name}-b": ("http://10.1.0.8:8000", False)}
    chat.refresh_from_db()
    assert chat.ready_replicas == 1 and chat.state == Endpoint.State.SCALING
    # the endpoint is deleted: the next pass prunes its Deployment and Service
    Pod.objects.filter(endpoint=chat).delete()
    chat.delete()
    scaling.horizontal_pass(cluster, NOW.replace(second=30))
    assert kube.names("deployments") == [] and kube.names("services") == []


def test_a_pod_event_lands_on_its_endpoint(owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    e = pods.record_pod_event(
        PodEvent("crash_loop", "critical", "ep-1-a", "in CrashLoopBackOff", chat.pk, {"restarts": 5})
    )
    assert (e.kind, e.severity, e.endpoint, e.tenant, e.pod) == (
        "crash_loop",
        "critical",
        chat,
        owner,
        "ep-1-a",
    )
    assert e.detail == {"restarts": 5} and e.reported_by == "kubernetes"
    orphan = pods.record_pod_event(PodEvent("restart", "warning", "ep-999-a", "restarted", 999))
    assert orphan.endpoint is None and orphan.tenant is None


@pytest.mark.django_db(transaction=True)
def test_watch_pods_records_restarts_until_sigterm(kube, owner, make_endpoint):
    chat = make_endpoint(owner, "chat")
    name = f"ep-{chat.pk}-v1"
    kube.put("pods", pod(f"{name}-a", deployment=name, endpoint=str(chat.pk)))
    outcome = {}

    def meanwhile():
        try:
            kube.wait_for_watches(1, timeout=10)
            restarted = pod(f"{name}-a", deployment=name, endpoint=str(chat.pk), restarts=1)
            restarted["status"]["containerStatuses"][0]["lastState"] = {
                "terminated": {"reason": "Error", "exitCode": 137}
            }
            kube.put("pods", restarted)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not Event.objects.filter(kind="restart").exists():
                time.sleep(0.05)
            outcome["events"] = list(
                Event.objects.filter(kind="restart").values("pod", "endpoint", "message")
            )
        finally:
            connection.close()
            os.kill(os.getpid(), signal.SIGTERM)

    helper = threading.Thread(target=meanwhile)
    previous = signal.getsignal(signal.SIGTERM)
    helper.start()
    call_command("watch_pods")
    helper.join(5)
    assert signal.getsignal(signal.SIGTERM) == previous
    (event,) = outcome["events"]
    assert (
        event["pod"] == f"{name}-a" and event["endpoint"] == chat.pk and "exit code 137" in event["message"]
    )


def test_a_rollout_on_kubernetes_runs_both_versions_then_removes_the_old(kube, owner, make_endpoint, h100):
    """The same rollout as on the local agent (tests/test_rollouts.py), through the Kubernetes
    driver: v2's Deployment and Service appear beside v1's, and v1's go once v2 is ready and drained."""
    from datetime import timedelta

    from controlplane.capacity.models import ModelProfile

    chat = make_endpoint(owner, "chat")
    newer = ModelProfile.objects.create(model="llama-8b-v2", gpu_type=h100, alpha=0, beta=0.004, gamma=0)
    cluster = drivers.driver()
    v1, v2 = f"ep-{chat.pk}-v1", f"ep-{chat.pk}-v2"
    scaling.horizontal_pass(cluster, NOW)
    assert kube.names("deployments") == [v1]
    chat.profile = newer
    save_endpoint(chat)
    scaling.horizontal_pass(cluster, NOW + timedelta(seconds=5))
    assert kube.names("deployments") == [v1, v2] and kube.names("services") == [v1, v2]
    assert kube.get("deployments", v2)["metadata"]["labels"]["mu/version"] == "2"
    kube.put("pods", pod(f"{v2}-a", deployment=v2, endpoint=str(chat.pk), ip="10.1.0.9"))
    pods.sync_pods(cluster)
    assert Pod.objects.get(name=f"{v2}-a").version == 2
    scaling.horizontal_pass(cluster, NOW + timedelta(seconds=10))  # v2 ready: traffic moves
    assert kube.names("deployments") == [v1, v2]
    scaling.horizontal_pass(cluster, NOW + timedelta(seconds=25))  # drained: v1 goes
    assert kube.names("deployments") == [v2] and kube.names("services") == [v2]


def test_a_rename_sends_kubernetes_nothing_so_no_pod_restarts(kube, owner, make_endpoint):
    """Its pods keep the name it was created under: the pass after a rename declares the same
    Deployment, so the driver sends nothing (a changed pod template would roll every pod)."""
    chat = make_endpoint(owner, "chat")
    cluster = drivers.driver()
    scaling.horizontal_pass(cluster, NOW)
    name = f"ep-{chat.pk}-v1"
    sent = len(kube.mutating_requests())
    chat.name = "assistant"
    save_endpoint(chat, changed=["name"])
    scaling.horizontal_pass(cluster, NOW.replace(second=5))
    assert kube.mutating_requests()[sent:] == []
    (container,) = kube.get("deployments", name)["spec"]["template"]["spec"]["containers"]
    assert container["args"][container["args"].index("--served-model-name") + 1] == "chat"
