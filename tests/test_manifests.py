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


def test_exactly_one_beat(documents):
    beat = next(d for d in documents if d["metadata"]["name"] == "controlplane-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"


def test_images_are_pinned_and_run_as_non_root():
    for dockerfile in (ROOT / "docker").glob("*.Dockerfile"):
        text = dockerfile.read_text()
        base = next(line.split()[1] for line in text.splitlines() if line.startswith("FROM "))
        assert ":" in base and not base.endswith(":latest"), dockerfile.name
        assert "USER 10001" in text, dockerfile.name


def test_healthz_answers_for_the_kubelet(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.content == b"ok"
