"""Kubernetes manifests: the dev overlay renders, validates against Kubernetes' published schemas,
and keeps the rules a platform team checks in review (non-root, limits, probes, least privilege)."""

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
KUBERNETES_VERSION = "1.32.0"
KUBECTL = shutil.which("kubectl")

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="needs kubectl (its built-in kustomize) on PATH")


@pytest.fixture(scope="module")
def documents():
    rendered = subprocess.run(
        [KUBECTL, "kustomize", str(ROOT / "docker/k8s/overlays/dev")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def pod_specs(documents):
    for doc in documents:
        if doc["kind"] in ("Deployment", "Job"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def test_every_document_validates_against_the_kubernetes_schema(documents):
    kinds = {doc["kind"] for doc in documents}
    assert {
        "Namespace",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "Role",
        "RoleBinding",
        "Job",
    } <= kinds
    for doc in documents:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_our_containers_run_as_non_root_with_limits(documents):
    for name, spec in pod_specs(documents):
        if name in ("postgres", "redis"):  # dev-only backing services from upstream images
            continue
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        for container in spec["containers"]:
            assert container["resources"]["limits"], name
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, name


def test_serving_containers_have_probes(documents):
    for name, spec in pod_specs(documents):
        for container in spec["containers"]:
            if container.get("ports") and name not in ("postgres", "redis"):
                assert "readinessProbe" in container and "livenessProbe" in container, name


def test_the_router_cannot_be_drained_all_at_once(documents):
    (pdb,) = [d for d in documents if d["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "router"}


def test_rbac_is_least_privilege(documents):
    for role in (d for d in documents if d["kind"] in ("Role", "ClusterRole")):
        assert role["kind"] == "Role", "no cluster-wide roles"
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], role["metadata"]["name"]
    router = next(d for d in documents if d["kind"] == "Role" and d["metadata"]["name"] == "router-discovery")
    assert router["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]


def test_the_control_plane_may_run_runtime_deployments_and_nothing_more(documents):
    role = next(
        d for d in documents if d["kind"] == "Role" and d["metadata"]["name"] == "controlplane-runtime"
    )
    assert role["metadata"]["namespace"] == "mu-runtime"
    rights = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert rights == {
        ("apps", "deployments"): {"get", "list", "create", "patch", "delete"},  # apply and prune
        ("apps", "deployments/scale"): {"get", "patch"},
        ("", "services"): {"get", "list", "create", "patch", "delete"},  # one per deployment
        ("", "secrets"): {"list", "create", "patch", "delete"},  # its pods' events credential
        ("", "pods"): {"get", "list", "watch"},  # readiness, restarts
    }
    bindings = {
        (d["metadata"]["namespace"], d["roleRef"]["name"]): d["subjects"]
        for d in documents
        if d["kind"] == "RoleBinding"
    }
    assert set(bindings) == {("mu-runtime", "controlplane-runtime"), ("mu-runtime", "router-discovery")}


def test_exactly_one_beat(documents):
    beat = next(d for d in documents if d["metadata"]["name"] == "controlplane-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"


def test_exactly_one_pod_watcher(documents):
    watcher = next(d for d in documents if d["metadata"]["name"] == "controlplane-podwatch")
    assert watcher["spec"]["replicas"] == 1 and watcher["spec"]["strategy"]["type"] == "Recreate"
    (container,) = watcher["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "manage.py", "watch_pods"]


def test_the_router_and_the_driver_agree_on_the_runtime_namespace(documents):
    env = next(
        d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "controlplane-env"
    )
    router = next(d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "router")
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert env["data"]["CLUSTER_DRIVER"] == "kubernetes"
    assert args[args.index("--endpointslices") + 1] == env["data"]["KUBERNETES_NAMESPACE"] == "mu-runtime"


def test_the_router_meters_into_the_redis_the_control_plane_reads(documents):
    # The autoscaler reads the routers' per-second rows from REDIS_URL: a router writing to
    # another database (it once wrote to db 1 while the control plane read db 0) meters nothing.
    env = next(
        d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "controlplane-env"
    )
    router = next(d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "router")
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--redis") + 1] == env["data"]["REDIS_URL"]


def test_the_router_serves_metrics_on_its_admin_port_and_prometheus_scrapes_it(documents):
    router = next(d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"] == "router")
    (container,) = router["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    admin_port = int(args[args.index("--admin-listen") + 1].rpartition(":")[2])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["admin"] == admin_port != ports["http"]
    annotations = router["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(admin_port)
    assert annotations["prometheus.io/path"] == "/metrics"
    service = next(d for d in documents if d["kind"] == "Service" and d["metadata"]["name"] == "router")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]  # tenants never reach it


def test_the_runtime_deployments_the_driver_generates_validate(documents):
    """What the control plane will create at run time, with the dev overlay's settings."""
    from dataplane.cluster.driver import Deployment
    from dataplane.cluster.k8s_objects import RuntimePodConfig, deployment_manifest, service_manifest

    env = next(
        d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "controlplane-env"
    )
    config = RuntimePodConfig(
        namespace=env["data"]["KUBERNETES_NAMESPACE"],
        sim_image=env["data"]["RUNTIME_SIM_IMAGE"],
        vllm_image=env["data"]["RUNTIME_VLLM_IMAGE"],
        image_pull_policy=env["data"]["RUNTIME_IMAGE_PULL_POLICY"],
        events_url=env["data"]["RUNTIME_EVENTS_URL"],
    )
    assert config.sim_image == "mu/runtime-sim:dev"
    for d in (
        Deployment(
            "ep-1",
            2,
            "sim",
            ("--profile", "h100-llama-8b", "--served-model-name", "chat"),
            8,
            {"endpoint": "1"},
        ),
        Deployment(
            "ep-2", 1, "vllm", ("--model", "/models/m", "-tp", "2"), 16, {"endpoint": "2", "tenant": "acme"}
        ),
    ):
        for manifest in (deployment_manifest(d, config), service_manifest(d, config)):
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
            spec = manifest["spec"].get("template", {}).get("spec")
            if spec:
                assert spec["securityContext"]["runAsNonRoot"] is True
                for container in spec["containers"]:
                    assert container["resources"]["limits"] and "readinessProbe" in container


def test_images_are_pinned_and_run_as_non_root():
    for dockerfile in (ROOT / "docker").glob("*.Dockerfile"):
        text = dockerfile.read_text()
        base = next(line.split()[1] for line in text.splitlines() if line.startswith("FROM "))
        assert ":" in base and not base.endswith(":latest"), dockerfile.name
        assert "USER 10001" in text, dockerfile.name


def test_healthz_answers_for_the_kubelet(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.content == b"ok"


def test_keys_reach_containers_from_secrets_never_from_arguments(documents):
    """A container's arguments show in `ps` on its node and in the API's pod spec: the router's
    operator key, like every *KEY variable, comes from a Secret into the environment."""
    for name, spec in pod_specs(documents):
        for container in spec["containers"]:
            argv = [*container.get("command", []), *container.get("args", [])]
            assert not [a for a in argv if a in ("--key", "--events-key")], (name, argv)
            for var in container.get("env", []):
                if var["name"].endswith("KEY"):
                    assert "value" not in var and "secretKeyRef" in var["valueFrom"], (name, var)
    (router,) = [spec for name, spec in pod_specs(documents) if name == "router"]
    env = {v["name"]: v for v in router["containers"][0]["env"]}
    assert env["ROUTER_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "router-key", "key": "key"}


def test_the_control_plane_env_is_production_but_for_tls_in_dev(documents):
    (config,) = [
        d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "controlplane-env"
    ]
    assert config["data"]["DEBUG"] == "0" and "*" not in config["data"]["ALLOWED_HOSTS"]
    assert config["data"]["BEHIND_TLS_PROXY"] == "0"  # the dev overlay: port-forward is plain HTTP
    base = yaml.safe_load((ROOT / "docker/k8s/base/config.yaml").read_text())
    assert base["data"]["BEHIND_TLS_PROXY"] == "1"


def test_runtime_pods_take_the_fleet_key_the_routers_send(documents):
    """One Secret, fleet-key, in both namespaces: the routers and the Celery workers (benchmarks)
    send it, the runtime pods the driver generates accept only it (their $VLLM_API_KEY)."""
    from dataplane.cluster.driver import Deployment
    from dataplane.cluster.k8s_objects import RuntimePodConfig, deployment_manifest

    secrets = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d
        for d in documents
        if d["kind"] == "Secret" and d["metadata"]["name"] == "fleet-key"
    }
    assert set(secrets) == {("mu-system", "fleet-key"), ("mu-runtime", "fleet-key")}
    assert len({s["data"]["key"] for s in secrets.values()}) == 1  # the same key on both sides
    envs = {
        name: {v["name"]: v for v in spec["containers"][0].get("env", [])}
        for name, spec in pod_specs(documents)
    }
    ref = {"secretKeyRef": {"name": "fleet-key", "key": "key"}}
    assert envs["router"]["ROUTER_POD_KEY"]["valueFrom"] == ref
    assert envs["controlplane-worker"]["MU_POD_KEY"]["valueFrom"] == ref
    pod = deployment_manifest(
        Deployment("ep-1", 1, "sim", ("--profile", "tiny-test"), 8, {}), RuntimePodConfig()
    )
    (container,) = pod["spec"]["template"]["spec"]["containers"]
    assert {v["name"]: v for v in container["env"]}["VLLM_API_KEY"]["valueFrom"] == ref  # required
    assert not [a for a in container["args"] if "key" in a]


def test_network_policies_admit_only_routers_to_pods_and_the_control_plane_to_its_stores(documents):
    policies = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]
        for d in documents
        if d["kind"] == "NetworkPolicy"
    }
    deny = policies[("mu-runtime", "default-deny-ingress")]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress"]}  # nothing else reaches mu-runtime

    def admitted(spec):
        (rule,) = spec["ingress"]
        names = set()
        for peer in rule["from"]:
            (expr,) = peer["podSelector"]["matchExpressions"]
            assert expr["key"] == "app.kubernetes.io/name" and expr["operator"] == "In"
            names |= set(expr["values"])
        return names, [p["port"] for p in rule["ports"]]

    runtime = policies[("mu-runtime", "runtime-from-routers")]
    assert runtime["podSelector"] == {"matchLabels": {"app.kubernetes.io/managed-by": "mu-controlplane"}}
    assert runtime["ingress"][0]["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "mu-system"}
    }
    assert admitted(runtime) == ({"router", "controlplane-worker"}, ["engine"])
    control_plane = {"controlplane-web", "controlplane-worker", "controlplane-beat", "controlplane-podwatch"}
    names, ports = admitted(policies[("mu-system", "postgres-from-control-plane")])
    assert (names, ports) == (control_plane | {"controlplane-migrate"}, [5432])
    names, ports = admitted(policies[("mu-system", "redis-from-control-plane-and-routers")])
    assert (names, ports) == (control_plane | {"router"}, [6379])
    # every name a policy admits is a pod of ours, labelled so (a typo would admit no one)
    labelled = {
        doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
        for doc in documents
        if doc["kind"] in ("Deployment", "Job")
    }
    assert control_plane | {"router", "controlplane-migrate"} <= labelled
    # the ports named are the runtime pods' (the driver's container ports)
    from dataplane.cluster.k8s_objects import ENGINE_PORT_NAME

    assert ENGINE_PORT_NAME == "engine"


def test_prometheus_may_scrape_the_runtime_pods_past_the_default_deny():
    rendered = subprocess.run(
        [KUBECTL, "kustomize", str(ROOT / "docker/k8s/monitoring")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (policy,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "NetworkPolicy"]
    kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
    assert [p["port"] for p in policy["spec"]["ingress"][0]["ports"]] == ["engine", "probe"]
