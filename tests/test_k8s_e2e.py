"""End to end on a real Kubernetes cluster: deploy the dev overlay, then a scale-up under load
through the router and a hung pod restarted by its liveness probe, with its events.

Skipped (with the reason) unless KUBECONFIG names a reachable cluster and kubectl is on PATH.
To keep `make test` from deploying onto whatever cluster a shell happens to point at, the
current context must be a kind cluster (`kind-...`) unless MU_E2E_ANY_CLUSTER=1. The images
must be on the nodes first (docs/kubernetes.md): mu/controlplane:dev, mu/router:dev and
mu/runtime-sim:dev. MU_E2E_KEEP=1 leaves the test's endpoint running afterwards (the stack is
always left up: `kubectl delete -k docker/k8s/overlays/dev` removes it).

What it does, in order:
  1. `kubectl apply -k docker/k8s/overlays/dev`; wait for PostgreSQL, Redis, the migrations and
     the control plane; make an operator key and put it in the router's and the runtime pods'
     Secrets; restart the router to read it.
  2. Create a tenant, a key and a SIMULATED endpoint (2 requests per replica, 1..4 replicas); wait
     until its Deployment (made by the control plane's Kubernetes driver) has a ready pod.
  3. Scale-up: 16 clients through the router (port-forward) until the Deployment has more than
     one ready replica, and a `scale` event says why.
  4. Hang restart: freeze one pod's engine (SIGSTOP; production pods serve no fault switch); its
     prober fails /livez, the kubelet restarts the container, the pod watcher records a
     `restart` event and the prober a `hang` event.

  5. Rollout: under load, the endpoint's model changes (a new version, Deployment ...-v2); the
     control plane rolls it out (new pods ready, traffic moved, old pods drained and removed)
     and the load generator sees no failed request.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KUBECTL = shutil.which("kubectl")
SYSTEM, RUNTIME = "mu-system", "mu-runtime"


def _skip_reason() -> str | None:
    if KUBECTL is None:
        return "needs kubectl on PATH"
    if not os.environ.get("KUBECONFIG"):
        return "needs KUBECONFIG pointing at a cluster (e.g. kind; see docs/kubernetes.md)"
    try:
        context = subprocess.run(
            [KUBECTL, "config", "current-context"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        subprocess.run([KUBECTL, "get", "--raw", "/readyz"], capture_output=True, timeout=10, check=True)
    except (subprocess.SubprocessError, OSError) as exc:
        return f"the cluster of KUBECONFIG={os.environ['KUBECONFIG']} is not reachable: {exc}"
    if not context.startswith("kind-") and os.environ.get("MU_E2E_ANY_CLUSTER") != "1":
        return f"context {context!r} is not a kind cluster; set MU_E2E_ANY_CLUSTER=1 to deploy onto it"
    return None


SKIP = _skip_reason()
pytestmark = [
    pytest.mark.stack,  # a cluster, kubectl port-forward and the load generator
    pytest.mark.skipif(SKIP is not None, reason=SKIP or ""),
    pytest.mark.timeout(1800),
]


def kubectl(*args: str, stdin: str | None = None, timeout: float = 120) -> str:
    done = subprocess.run(
        [str(KUBECTL), *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def manage(*args: str, timeout: float = 120) -> str:
    """`python manage.py ...` in the control plane's web pod; its standard output."""
    return kubectl(
        "-n", SYSTEM, "exec", "deploy/controlplane-web", "--", "python", "manage.py", *args, timeout=timeout
    )


def shell(code: str) -> object:
    """Run Python in the control plane (Django set up); its last output line, as JSON."""
    return json.loads(manage("shell", "-c", code).strip().splitlines()[-1])


def eventually(what: str, check, timeout: float, every: float = 2.0):
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except AssertionError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def deployment(name: str) -> dict:
    return json.loads(kubectl("-n", RUNTIME, "get", "deployment", name, "-o", "json"))


def pods_of(name: str) -> list[dict]:
    return json.loads(kubectl("-n", RUNTIME, "get", "pods", "-l", f"mu/deployment={name}", "-o", "json"))[
        "items"
    ]


def put_secret(namespace: str, name: str, key: str) -> None:
    """The Secret on kubectl's stdin: a key never goes on a command line (ps shows those)."""
    metadata = {"name": name, "namespace": namespace}
    manifest = {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "stringData": {"key": key}}
    kubectl("apply", "-f", "-", stdin=json.dumps(manifest))


SETUP = """
import json, time
from controlplane.capacity.models import GpuPool, GpuType, ModelProfile
from controlplane.endpoints.models import Endpoint
from controlplane.selling import save_endpoint
from controlplane.tenants.models import ApiKey, Tenant
gpu, _ = GpuType.objects.get_or_create(
    name="h100-80gb", defaults={"memory_gib": 80, "hourly_cost_usd": "2.49"}
)
pool, _ = GpuPool.objects.get_or_create(
    name="e2e-pool", defaults={"gpu_type": gpu, "region": "kind", "gpu_count": 64}
)
profile, _ = ModelProfile.objects.get_or_create(
    model="e2e-sim", gpu_type=gpu,
    defaults={"alpha": 0.0004, "beta": 0.004, "gamma": 0.02, "gpus_per_replica": 1},
)
tenant, _ = Tenant.objects.get_or_create(name="e2e")
endpoint = Endpoint(
    tenant=tenant, name=f"e2e-{int(time.time())}", profile=profile, pool=pool,
    min_provisioned_concurrency=2, max_provisioned_concurrency=8, target_concurrency_per_replica=2,
    autoscaler={"scale_down_window_s": 60},
)
save_endpoint(endpoint)
_, key = ApiKey.issue(name="e2e", tenant=tenant)
print(json.dumps({"id": endpoint.pk, "name": endpoint.name, "key": key}))
"""


@pytest.fixture(scope="module")
def stack():
    kubectl("apply", "-k", str(ROOT / "docker/k8s/overlays/dev"), timeout=180)
    kubectl(
        "-n", SYSTEM, "rollout", "status", "deploy/postgres", "deploy/redis", "--timeout=300s", timeout=330
    )
    kubectl(
        "-n",
        SYSTEM,
        "wait",
        "--for=condition=complete",
        "job/controlplane-migrate",
        "--timeout=600s",
        timeout=630,
    )
    for name in ("controlplane-web", "controlplane-worker", "controlplane-beat", "controlplane-podwatch"):
        kubectl("-n", SYSTEM, "rollout", "status", f"deploy/{name}", "--timeout=300s", timeout=330)
    operator_key = manage("create_operator_key", "e2e").strip().splitlines()[-1]
    put_secret(SYSTEM, "router-key", operator_key)
    kubectl("-n", SYSTEM, "rollout", "restart", "deploy/router")
    kubectl("-n", SYSTEM, "rollout", "status", "deploy/router", "--timeout=300s", timeout=330)
    endpoint = shell(SETUP)
    assert isinstance(endpoint, dict)
    name = f"ep-{endpoint['id']}-v1"
    eventually(
        f"Deployment {name} with a ready pod",
        lambda: (deployment(name).get("status", {}).get("readyReplicas") or 0) >= 1,
        timeout=300,
    )
    forward = subprocess.Popen(
        [str(KUBECTL), "-n", SYSTEM, "port-forward", "svc/router", ":80"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    line = forward.stdout.readline() if forward.stdout else ""
    match = re.search(r"127\.0\.0\.1:(\d+)", line)
    assert match, f"kubectl port-forward said {line!r}"
    try:
        yield {**endpoint, "deployment": name, "router": f"http://127.0.0.1:{match[1]}"}
    finally:
        forward.terminate()
        forward.wait(10)
        if os.environ.get("MU_E2E_KEEP") != "1":
            shell(
                "import json\nfrom controlplane.endpoints.models import Endpoint\n"
                f"print(json.dumps(Endpoint.objects.filter(pk={endpoint['id']}).delete()[0]))"
            )


def load_generator(stack: dict, stages: str, max_tokens: int) -> subprocess.Popen[str]:
    """`python -m dataplane.loadgen` against the stack's endpoint, through the router."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "dataplane.loadgen", "--url", stack["router"]),
            *("--model", stack["name"], "--stages", stages, "--max-tokens", str(max_tokens)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "MU_API_KEY": stack["key"]},
        cwd=ROOT,
    )


def test_scale_up_under_load_through_the_router(stack):
    name = stack["deployment"]
    load = load_generator(stack, "240x16", max_tokens=64)
    try:
        eventually(
            f"{name} to scale past one ready replica under load",
            lambda: (deployment(name).get("status", {}).get("readyReplicas") or 0) >= 2,
            timeout=240,
        )
    finally:
        load.terminate()
        output, _ = load.communicate(timeout=30)
    assert "Traceback" not in output, output
    scale = shell(
        "import json\nfrom controlplane.oncall.models import Event\n"
        f"print(json.dumps(list(Event.objects.filter(kind='scale', endpoint_id={stack['id']})"
        ".values_list('message', flat=True))))"
    )
    assert isinstance(scale, list) and any("->" in m for m in scale), scale


def test_a_hung_pod_is_restarted_and_on_call_hears_of_it(stack):
    name = stack["deployment"]
    ready = [p for p in pods_of(name) if any(c["ready"] for c in p["status"].get("containerStatuses", []))]
    assert ready, f"no ready pod of {name}"
    victim = ready[0]["metadata"]["name"]
    restarts = ready[0]["status"]["containerStatuses"][0]["restartCount"]
    # The engine frozen (SIGSTOP): the fault switch is not served by production pods, and a
    # stopped engine is what a hung one looks like from outside (no answers, no progress).
    hang = (
        "import os, signal, pathlib; [os.kill(int(p.parent.name), signal.SIGSTOP) "
        "for p in pathlib.Path('/proc').glob('[0-9]*/cmdline') "
        "if p.parent.name != str(os.getpid()) and b'dataplane.runtime.sim' in p.read_bytes()]"
    )
    kubectl("-n", RUNTIME, "exec", victim, "--", "python", "-c", hang)

    def restarted() -> bool:
        pod = json.loads(kubectl("-n", RUNTIME, "get", "pod", victim, "-o", "json"))
        return bool(pod["status"]["containerStatuses"][0]["restartCount"] > restarts)

    eventually(f"the kubelet to restart {victim}", restarted, timeout=300, every=5)
    # the pod watcher's restart event, and the prober's hang event (with its endpoint's events
    # credential, from the Secret the control plane made for the deployment)
    eventually(
        f"restart and hang events for {victim}",
        lambda: {"restart", "hang"} <= set(event_kinds(victim)),
        timeout=120,
        every=5,
    )


def event_kinds(pod: str) -> list[str]:
    kinds = shell(
        "import json\nfrom controlplane.oncall.models import Event\n"
        f"print(json.dumps(list(Event.objects.filter(pod='{pod}').values_list('kind', flat=True))))"
    )
    assert isinstance(kinds, list)
    return [str(k) for k in kinds]


def test_rollout_under_load(stack):
    """A new version rolled out under load: no failed request, the old Deployment removed after
    its pods drained (weight 0 in the routers' split, then EndpointSlice `terminating`)."""
    load = load_generator(stack, "180x4", max_tokens=32)
    try:
        time.sleep(10)  # the load runs on v1 first
        shell(
            "import json\nfrom controlplane.capacity.models import ModelProfile\n"
            "from controlplane.endpoints.models import Endpoint\n"
            "from controlplane.selling import save_endpoint\n"
            f"e = Endpoint.objects.get(pk={stack['id']})\n"
            "e.profile, _ = ModelProfile.objects.get_or_create(model='e2e-sim-v2',"
            " gpu_type=e.profile.gpu_type,"
            " defaults={'alpha': 0.0004, 'beta': 0.004, 'gamma': 0.02, 'gpus_per_replica': 1})\n"
            "save_endpoint(e)\nprint(json.dumps(e.version))"
        )
        old = stack["deployment"]
        eventually(
            f"the rollout to remove {old}",
            lambda: old not in kubectl("-n", RUNTIME, "get", "deploy", "-o", "name"),
            timeout=600,
            every=5,
        )
    finally:
        output, _ = load.communicate(timeout=240)
    total = next(line for line in output.splitlines() if line.startswith("total "))
    assert "errors -" in total, output
    phases = shell(
        "import json\nfrom controlplane.endpoints.models import Rollout\n"
        f"print(json.dumps(list(Rollout.objects.filter(endpoint_id={stack['id']})"
        ".values_list('phase', flat=True))))"
    )
    assert phases == ["done"], phases
