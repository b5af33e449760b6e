"""The Kubernetes driver against the stand-in API server, through a real kubernetes ApiClient:
server-side apply, prune, no call for an unchanged apply, the scale subresource, an annotation
for target concurrency, 409 retried, other errors as ClusterError, pods read back."""

import pytest

from dataplane.cluster.driver import ClusterError, Deployment
from dataplane.cluster.k8s_objects import RuntimePodConfig
from dataplane.cluster.kubernetes import KubernetesDriver
from tests.cluster.kube_standin import pod

ARGS = ("--profile", "h100-llama-8b", "--served-model-name", "chat")


def dep(name: str = "ep-1", replicas: int = 2, target: int = 8, endpoint: str = "1") -> Deployment:
    return Deployment(name, replicas, "sim", ARGS, target, {"endpoint": endpoint, "tenant": "acme"})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def sleeps():
    return []


@pytest.fixture
def driver(standin, clock, sleeps):
    return KubernetesDriver(RuntimePodConfig(), standin.api_client(), clock=clock, sleep=sleeps.append)


def test_apply_server_side_applies_a_deployment_and_a_service_per_deployment(standin, driver):
    driver.apply([dep("ep-1"), dep("ep-2", 0, endpoint="2")])
    assert standin.names("deployments") == ["ep-1", "ep-2"]
    assert standin.names("services") == ["ep-1", "ep-2"]
    patches = [r for r in standin.requests if r.method == "PATCH"]
    assert len(patches) == 4
    for r in patches:
        assert r.content_type == "application/apply-patch+yaml"
        assert r.query == {"fieldManager": "mu-controlplane", "force": "true"}
    d = standin.get("deployments", "ep-1")
    assert d["spec"]["replicas"] == 2
    assert d["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "mu-controlplane"
    assert d["metadata"]["labels"]["mu/endpoint"] == "1"
    assert d["metadata"]["annotations"] == {"mu/target-concurrency": "8"}
    container = d["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "mu/runtime-sim:0.1.0" and container["args"][:4] == list(ARGS)
    svc = standin.get("services", "ep-1")
    assert svc["spec"]["selector"] == {"mu/deployment": "ep-1"} and svc["spec"]["clusterIP"] == "None"


def test_apply_updates_what_changed_and_prunes_what_is_no_longer_declared(standin, driver):
    unmanaged = {"metadata": {"name": "someone-else", "labels": {"app": "x"}}, "spec": {"replicas": 1}}
    standin.put("deployments", unmanaged)
    driver.apply([dep("ep-1"), dep("ep-2", endpoint="2")])
    driver.apply([dep("ep-1", replicas=3)])
    assert standin.get("deployments", "ep-1")["spec"]["replicas"] == 3
    assert standin.names("deployments") == ["ep-1", "someone-else"]  # not ours: never pruned
    assert standin.names("services") == ["ep-1"]
    deletes = [r.path.rsplit("/", 2)[-2:] for r in standin.requests if r.method == "DELETE"]
    assert deletes == [["deployments", "ep-2"], ["services", "ep-2"]]
    assert all(
        r.body == {"propagationPolicy": "Background"} for r in standin.requests if r.method == "DELETE"
    )


def test_an_unchanged_apply_makes_no_call_until_the_resync(standin, driver, clock):
    driver.apply([dep("ep-1"), dep("ep-2", endpoint="2")])
    before = len(standin.requests)
    clock.now = 120.0
    driver.apply([dep("ep-2", endpoint="2"), dep("ep-1")])
    assert len(standin.requests) == before
    # someone deletes our Deployment behind our back: the resync puts it back
    standin.delete("deployments", "ep-1")
    clock.now = 301.0
    driver.apply([dep("ep-1"), dep("ep-2", endpoint="2")])
    assert standin.names("deployments") == ["ep-1", "ep-2"]
    assert len(standin.mutating_requests()) == 8  # 4 applies at first, 4 again at the resync


def test_scale_uses_the_scale_subresource(standin, driver):
    driver.apply([dep("ep-1", replicas=0)])
    driver.scale("ep-1", 3)
    last = standin.requests[-1]
    assert (last.method, last.path) == ("PATCH", "/apis/apps/v1/namespaces/mu-runtime/deployments/ep-1/scale")
    assert last.body == {"spec": {"replicas": 3}} and last.query == {"fieldManager": "mu-controlplane"}
    assert standin.get("deployments", "ep-1")["spec"]["replicas"] == 3
    # the next apply declares the count again even though the deployment did not change since
    # the last apply: a scale happened in between
    before = len(standin.mutating_requests())
    driver.apply([dep("ep-1", replicas=0)])
    assert len(standin.mutating_requests()) == before + 2
    assert standin.get("deployments", "ep-1")["spec"]["replicas"] == 0


def test_target_concurrency_is_an_annotation_not_a_pod_template_change(standin, driver):
    driver.apply([dep("ep-1")])
    template = standin.get("deployments", "ep-1")["spec"]["template"]
    driver.set_target_concurrency("ep-1", 5)
    d = standin.get("deployments", "ep-1")
    assert d["metadata"]["annotations"]["mu/target-concurrency"] == "5"
    assert d["spec"]["template"] == template  # no rollout, no restart
    last = standin.requests[-1]
    assert last.path.endswith("/deployments/ep-1") and last.content_type != "application/apply-patch+yaml"


def test_a_conflict_is_retried_with_backoff_then_succeeds(standin, driver, sleeps):
    standin.fail("PATCH", "/deployments/ep-1", 409, times=2, message="the object has been modified")
    driver.apply([dep("ep-1")])
    assert standin.get("deployments", "ep-1") is not None
    assert sleeps == [0.1, 0.2]
    standin.fail("PATCH", "/deployments/ep-1/scale", 409)
    driver.scale("ep-1", 4)
    assert standin.get("deployments", "ep-1")["spec"]["replicas"] == 4


def test_endless_conflicts_and_other_refusals_raise_cluster_error_naming_the_call(standin, driver, sleeps):
    standin.fail("PATCH", "/deployments/ep-1", 409, times=100, message="the object has been modified")
    with pytest.raises(
        ClusterError, match=r"apply Deployment ep-1 .*409 the object has been modified after 4"
    ):
        driver.apply([dep("ep-1")])
    assert sleeps == [0.1, 0.2, 0.4, 0.8]
    standin.faults.clear()
    message = 'deployments.apps "ep-9" is forbidden: User "system:serviceaccount:mu-system:controlplane"'
    standin.fail("PATCH", "/deployments/ep-9/scale", 403, message=message)
    with pytest.raises(
        ClusterError, match=r"scale deployment ep-9 to 2 in namespace mu-runtime: 403 .*forbidden"
    ):
        driver.scale("ep-9", 2)
    with pytest.raises(ClusterError, match=r"scale deployment ep-404 to 1 .*: 404"):
        driver.scale("ep-404", 1)
    with pytest.raises(ClusterError, match="cannot be expressed in Kubernetes"):
        driver.apply([Deployment("EP_1", 1)])


def test_an_unreachable_api_server_is_a_cluster_error(standin, driver):
    standin.stop()
    with pytest.raises(ClusterError, match=r"kubernetes API server unreachable .*list pods"):
        driver.list_pods()


def test_list_pods_reads_readiness_and_drops_terminating_pods(standin, driver):
    standin.put("pods", pod("ep-1-a", ip="10.0.0.1", restarts=2))
    standin.put("pods", pod("ep-1-b", ip="10.0.0.2", ready=False))
    standin.put("pods", pod("ep-1-c", ip="10.0.0.3", deleting=True))  # Ready, but being deleted
    standin.put("pods", pod("ep-1-d", ip=None, ready=False))  # not scheduled yet: no IP
    standin.put("pods", pod("ep-2-a", deployment="ep-2", endpoint="2", ip="fd00::5"))
    stranger = pod("x")
    stranger["metadata"]["labels"] = {"app": "x"}
    standin.put("pods", stranger)
    pods = {p.name: p for p in driver.list_pods()}
    assert sorted(pods) == ["ep-1-a", "ep-1-b", "ep-1-c", "ep-2-a"]
    assert (pods["ep-1-a"].ready, pods["ep-1-a"].restarts, pods["ep-1-a"].url) == (
        True,
        2,
        "http://10.0.0.1:8000",
    )
    assert pods["ep-1-a"].deployment == "ep-1" and pods["ep-1-a"].ready_after_s == 4.0
    assert not pods["ep-1-b"].ready and not pods["ep-1-c"].ready
    assert pods["ep-2-a"].url == "http://[fd00::5]:8000"
    assert standin.requests[-1].query["labelSelector"] == "app.kubernetes.io/managed-by=mu-controlplane"


def test_each_deployments_events_credential_goes_in_a_secret_of_its_own(standin, clock, sleeps):
    """Pods read their endpoint's events credential from their deployment's Secret (never the
    operator key's); the Secret is pruned with its deployment."""
    config = RuntimePodConfig(events_url="http://controlplane.mu-system.svc")
    driver = KubernetesDriver(config, standin.api_client(), clock=clock, sleep=sleeps.append)
    keyed = Deployment("ep-1", 1, "sim", ARGS, 8, {"endpoint": "1"}, "mupod_1_abc")
    driver.apply([keyed, dep("ep-2", endpoint="2")])
    assert standin.names("secrets") == ["ep-1-events"]  # ep-2 has no credential: no Secret
    assert standin.get("secrets", "ep-1-events")["stringData"] == {"key": "mupod_1_abc"}
    env = {
        e["name"]: e
        for e in standin.get("deployments", "ep-1")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["MU_POD_EVENTS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "ep-1-events", "key": "key"}
    assert "MU_CONTROL_PLANE_KEY" not in env
    driver.apply([dep("ep-2", endpoint="2")])
    assert standin.names("secrets") == [] and standin.names("deployments") == ["ep-2"]
