"""What the Kubernetes driver sends and how it reads pods back, as pure functions: every
generated manifest validates against Kubernetes' published schema (kubernetes-validate), and
pod status changes become the on-call events they should."""

from dataclasses import replace

import kubernetes_validate
import pytest

from dataplane.cluster.driver import Deployment
from dataplane.cluster.k8s_objects import (
    RuntimePodConfig,
    deployment_manifest,
    events_secret_manifest,
    gpus_of,
    label_value,
    manifest_hash,
    pod_events,
    service_manifest,
)
from tests.cluster.kube_standin import pod
from tests.test_manifests import KUBERNETES_VERSION

SIM = Deployment(
    "ep-42",
    2,
    "sim",
    ("--profile", "h100-llama-8b", "--time-scale", "1.0", "--served-model-name", "chat"),
    8,
    {"endpoint": "42", "tenant": "acme"},
    "mupod_42_0123abcd",
)
VLLM = Deployment(
    "ep-7",
    1,
    "vllm",
    (
        "--model",
        "/models/llama-70b",
        "--tensor-parallel-size",
        "4",
        "--api-server-count",
        "4",
        "--",
        "--gpu-memory-utilization",
        "0.9",
    ),
    16,
    {"endpoint": "7", "tenant": "Globex Corp."},
)
CONFIG = RuntimePodConfig(events_url="http://controlplane.mu-system.svc")


@pytest.mark.parametrize("d", [SIM, VLLM], ids=["sim", "vllm"])
def test_generated_manifests_validate_against_the_kubernetes_schema(d):
    secret = events_secret_manifest(d, CONFIG)
    manifests = [deployment_manifest(d, CONFIG), service_manifest(d, CONFIG), *([secret] if secret else [])]
    for manifest in manifests:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_the_runtime_pod_is_non_root_with_limits_probes_and_a_drain():
    spec = deployment_manifest(SIM, CONFIG)["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["automountServiceAccountToken"] is False
    assert c["securityContext"]["allowPrivilegeEscalation"] is False and c["resources"]["limits"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probe"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "probe"}
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert spec["terminationGracePeriodSeconds"] >= 5 + 30
    assert c["args"][-2:] == ["--grace", "30"]
    env = {e["name"]: e for e in c["env"]}
    assert env["MU_ENDPOINT_ID"]["value"] == "42"
    assert env["MU_CONTROL_PLANE_URL"]["value"] == "http://controlplane.mu-system.svc"
    # Its endpoint's events credential, from the deployment's own Secret; never the operator key.
    assert "MU_CONTROL_PLANE_KEY" not in env
    assert env["MU_POD_EVENTS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "ep-42-events", "key": "key"}
    secret = events_secret_manifest(SIM, CONFIG)
    assert secret is not None and secret["stringData"] == {"key": "mupod_42_0123abcd"}
    assert secret["metadata"]["labels"] == deployment_manifest(SIM, CONFIG)["metadata"]["labels"]  # pruned
    assert "mupod_42" not in repr(SIM) and events_secret_manifest(VLLM, CONFIG) is None  # VLLM: no key


def test_vllm_pods_get_their_gpus_and_the_drain_time_goes_before_vllms_own_arguments():
    d = deployment_manifest(VLLM, CONFIG)
    (c,) = d["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "mu/runtime-vllm:0.1.0"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert c["args"][-7:] == [
        "--api-server-count",
        "4",
        "--grace",
        "30",
        "--",
        "--gpu-memory-utilization",
        "0.9",
    ]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert d["metadata"]["labels"]["mu/tenant"] == label_value("Globex Corp.") != "Globex Corp."
    sim = deployment_manifest(SIM, CONFIG)["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in sim["resources"]["limits"]


def test_target_concurrency_lives_outside_the_pod_template():
    a = deployment_manifest(SIM, CONFIG)
    b = deployment_manifest(replace(SIM, target_concurrency=3), CONFIG)
    assert a["spec"]["template"] == b["spec"]["template"]
    assert b["metadata"]["annotations"] == {"mu/target-concurrency": "3"}
    assert manifest_hash(a) != manifest_hash(b)


@pytest.mark.parametrize(
    "args, gpus",
    [((), 1), (("--tensor-parallel-size", "2"), 2), (("-tp=4", "--pipeline-parallel-size", "2"), 8)],
)
def test_gpus_per_vllm_replica_follow_its_parallelism(args, gpus):
    assert gpus_of(args) == gpus


def test_label_values_kubernetes_refuses_are_made_safe_and_stay_distinct():
    assert label_value("acme") == "acme"
    assert label_value("Acme Corp!") != label_value("Acme Corp?")
    for value in ("Acme Corp!", "x" * 80, "-edge-", "é"):
        safe = label_value(value)
        assert len(safe) <= 63 and safe[0].isalnum() and safe[-1].isalnum(), safe


def test_a_bad_name_is_refused_before_anything_is_sent():
    with pytest.raises(ValueError, match="DNS label"):
        deployment_manifest(Deployment("Ep_1", 1), CONFIG)


# --- pod status -> events


def test_a_restart_becomes_a_restart_event_with_why_the_container_ended():
    old = pod("ep-42-a", endpoint="42", restarts=1)
    new = pod("ep-42-a", endpoint="42", restarts=2, terminated={"reason": "Error", "exitCode": 137})
    (event,) = pod_events(old, new)
    assert (event.kind, event.severity, event.pod, event.endpoint) == ("restart", "warning", "ep-42-a", 42)
    assert event.message == "pod ep-42-a container pod restarted (restart #2): Error, exit code 137"
    assert event.detail["exit_code"] == 137 and event.detail["new_restarts"] == 1
    assert pod_events(new, new) == []


def test_entering_crash_loop_back_off_is_reported_once():
    running = pod("ep-1-a", restarts=3)
    looping = pod("ep-1-a", restarts=4, waiting="CrashLoopBackOff")
    kinds = [e.kind for e in pod_events(running, looping)]
    assert kinds == ["restart", "crash_loop"]
    crash = pod_events(running, looping)[1]
    assert crash.severity == "critical" and "CrashLoopBackOff after 4 restarts" in crash.message
    assert pod_events(looping, looping) == []


def test_a_pod_first_seen_at_start_up_is_history_but_a_new_one_is_news():
    restarted = pod("ep-1-a", restarts=3, waiting="CrashLoopBackOff")
    assert pod_events(None, restarted, baseline=True) == []
    assert [e.kind for e in pod_events(None, restarted, baseline=False)] == ["restart", "crash_loop"]
    assert pod_events(None, pod("ep-1-b"), baseline=False) == []
