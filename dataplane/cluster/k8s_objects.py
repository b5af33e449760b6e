"""Kubernetes objects as plain dicts, built and read by pure functions (no I/O, no client).

The Kubernetes driver (`dataplane.cluster.kubernetes`) sends what `deployment_manifest` and
`service_manifest` build and reads pods back through `pod_state`; the pod watcher turns pod
status changes into on-call events with `pod_events`. Tests validate the manifests against
Kubernetes' published schemas (kubernetes-validate) without a cluster.

What a runtime Deployment looks like, for `Deployment("ep-42", 2, "sim", args, 8, {"endpoint":
"42", "tenant": "acme"})` in namespace mu-runtime:

- Deployment `ep-42`, labels `app.kubernetes.io/managed-by: mu-controlplane` (every object the
  driver owns; prune and the watchers select on it), `mu/deployment: ep-42` (the selector),
  `mu/endpoint: "42"`, `mu/tenant: acme`; annotation `mu/target-concurrency: "8"` on the
  Deployment's own metadata, never on the pod template, so changing it restarts nothing.
- One container `pod`: the runtime image (`mu/runtime-sim` or `mu/runtime-vllm`, whose
  entrypoint is `python -m dataplane.runtime.pod --engine ... --port 8000 --probe-port 8001`)
  with the deployment's args; readiness `/readyz` and liveness `/livez` on the prober's port,
  a startup probe that allows the model load; `nvidia.com/gpu` limits for vLLM from its
  tensor x pipeline parallel size (1 by default).
- Rolling updates surge one pod and never go below the declared replicas (maxUnavailable 0); a
  pod being deleted sleeps 5 s in preStop while routers drop it (EndpointSlice `terminating`),
  then drains its in-flight requests on SIGTERM.
- Service `ep-42`: headless, selector `mu/deployment: ep-42`, port `engine`. Its only purpose is
  the EndpointSlices Kubernetes makes for it, which carry the Service's labels (`mu/endpoint`,
  managed-by), so routers can watch pods' readiness per endpoint without reading pods.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dataplane.cluster.driver import Deployment, PodState
from dataplane.wire.pod_events import PodEvent, attribution

Obj = dict[str, Any]

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGER = "mu-controlplane"  # the managed-by value and the server-side apply field manager
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGER}"
LABEL_PREFIX = "mu/"
DEPLOYMENT_LABEL = LABEL_PREFIX + "deployment"
FLEET_KEY_VARIABLE = "VLLM_API_KEY"  # where vLLM, and the simulated engine, read their key
ENDPOINT_LABEL = LABEL_PREFIX + "endpoint"  # the control-plane endpoint id, digits
TARGET_CONCURRENCY_ANNOTATION = LABEL_PREFIX + "target-concurrency"
ENGINE_PORT_NAME = "engine"
PROBE_PORT_NAME = "probe"
CONTAINER_NAME = "pod"
GPU_RESOURCE = "nvidia.com/gpu"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


@dataclass(frozen=True)
class RuntimePodConfig:
    """How the driver runs an endpoint's pods; one per cluster (settings)."""

    namespace: str = "mu-runtime"  # where the runtime Deployments, Services and pods live
    sim_image: str = "mu/runtime-sim:0.1.0"  # SIMULATED engine + prober (no GPU)
    vllm_image: str = "mu/runtime-vllm:0.1.0"  # vLLM + prober
    image_pull_policy: str = "IfNotPresent"  # kind-loaded images must not be pulled
    engine_port: int = 8000  # the OpenAI server, as the images' entrypoints start it
    probe_port: int = 8001  # the prober's /livez and /readyz
    # Resources per pod. GPUs are added to the vLLM limits (tensor x pipeline parallel size).
    sim_resources: Mapping[str, Mapping[str, str]] = field(
        hash=False,  # the config stays hashable (one driver per config); equality still compares it
        default_factory=lambda: {
            "requests": {"cpu": "250m", "memory": "128Mi"},
            "limits": {"cpu": "1", "memory": "256Mi"},
        },
    )
    vllm_resources: Mapping[str, Mapping[str, str]] = field(
        hash=False,
        default_factory=lambda: {
            "requests": {"cpu": "4", "memory": "32Gi"},
            "limits": {"cpu": "8", "memory": "64Gi"},
        },
    )
    # Hang events from the pods' probers go to this control plane (empty: logged only), with
    # their endpoint's events credential from the deployment's own Secret (events_secret_manifest).
    events_url: str = ""
    # The fleet key, under `key` in this Secret of the runtime namespace: each engine's
    # $VLLM_API_KEY, so that it answers only the routers (and benchmarks) that send it. Required:
    # a pod without it would serve anyone ("": no key, open pods).
    fleet_key_secret: str = "fleet-key"
    prestop_sleep_s: int = 5  # a deleted pod keeps serving this long while routers drop it, s
    drain_grace_s: int = 30  # then SIGTERM: in-flight requests finish within this, s
    sim_startup_s: int = 120  # longest start to first ready, simulated engine, s
    vllm_startup_s: int = 1800  # ... vLLM (a 70B model loads for minutes), s

    def image(self, engine: str) -> str:
        return self.vllm_image if engine == "vllm" else self.sim_image

    @property
    def termination_grace_s(self) -> int:
        return self.prestop_sleep_s + self.drain_grace_s + 10


# --- names and labels


def check_name(name: str) -> str:
    """A Deployment/Service name must be a DNS label (RFC 1123), at most 63 characters."""
    if len(name) > 63 or not _DNS_LABEL.match(name):
        raise ValueError(f"deployment name {name!r} is not a DNS label (a-z, 0-9, '-', at most 63)")
    return name


def label_value(value: str) -> str:
    """`value` when Kubernetes accepts it as a label value; else a readable, unique stand-in
    ("Acme Corp!" -> "Acme-Corp-1b2c3d4e")."""
    if len(value) <= 63 and _LABEL_VALUE.match(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", value).strip("-_.")[:54].strip("-_.")
    return f"{cleaned}-{digest}" if cleaned else digest


def labels_of(d: Deployment) -> dict[str, str]:
    """Every label the driver puts on a deployment's objects and pods."""
    labels = {MANAGED_BY_LABEL: MANAGER, DEPLOYMENT_LABEL: d.name}
    for key, value in sorted(d.labels.items()):
        if not _LABEL_NAME.match(key) or len(key) > 60:
            raise ValueError(f"deployment {d.name}: label name {key!r} is not a valid label name")
        labels[LABEL_PREFIX + key] = label_value(value)
    return labels


PARALLEL_FLAGS = {
    "--tensor-parallel-size": "tensor",
    "-tp": "tensor",
    "--pipeline-parallel-size": "pipeline",
    "-pp": "pipeline",
}


def gpus_of(args: tuple[str, ...]) -> int:
    """GPUs one vLLM replica uses: tensor x pipeline parallel size from its arguments (1, 1)."""
    sizes = {"tensor": 1, "pipeline": 1}
    flags = PARALLEL_FLAGS
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in flags:
            raw = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if not raw.isdigit() or int(raw) < 1:
                raise ValueError(f"{flag} {raw!r} must be a positive integer")
            sizes[flags[flag]] = int(raw)
    return sizes["tensor"] * sizes["pipeline"]


# --- manifests


def deployment_manifest(d: Deployment, cfg: RuntimePodConfig) -> Obj:
    """The apps/v1 Deployment for `d`, as a server-side apply body (only the fields we own)."""
    check_name(d.name)
    labels = labels_of(d)
    vllm = d.engine == "vllm"
    resources: dict[str, dict[str, str]] = {
        kind: dict(values) for kind, values in (cfg.vllm_resources if vllm else cfg.sim_resources).items()
    }
    if vllm:
        resources.setdefault("limits", {})[GPU_RESOURCE] = str(gpus_of(d.args))
    env: list[Obj] = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    endpoint = d.labels.get("endpoint", "")
    if endpoint.isdigit():
        env.append({"name": "MU_ENDPOINT_ID", "value": endpoint})
    # whose pod this is, on its events (dataplane.wire.pod_events): the version and the tenant
    if d.labels.get("version", "").isdigit():
        env.append({"name": "MU_ENDPOINT_VERSION", "value": d.labels["version"]})
    if d.labels.get("tenant"):
        env.append({"name": "MU_TENANT", "value": d.labels["tenant"]})
    if cfg.events_url:
        env.append({"name": "MU_CONTROL_PLANE_URL", "value": cfg.events_url})
        if d.events_key:  # the endpoint's events credential, never the operator key
            ref = {"name": events_secret_name(d.name), "key": "key"}
            env.append({"name": "MU_POD_EVENTS_KEY", "valueFrom": {"secretKeyRef": ref}})
    if cfg.fleet_key_secret:
        ref = {"name": cfg.fleet_key_secret, "key": "key"}
        env.append({"name": FLEET_KEY_VARIABLE, "valueFrom": {"secretKeyRef": ref}})
    startup_period_s = 5
    startup_s = cfg.vllm_startup_s if vllm else cfg.sim_startup_s
    volumes: list[Obj] = [{"name": "tmp", "emptyDir": {}}]
    mounts: list[Obj] = [{"name": "tmp", "mountPath": "/tmp"}]
    if vllm:  # tensor-parallel workers talk through shared memory; the default 64 MiB is too small
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    container: Obj = {
        "name": CONTAINER_NAME,
        "image": cfg.image(d.engine),
        "imagePullPolicy": cfg.image_pull_policy,
        "args": _with_grace(d.args, cfg.drain_grace_s),
        "env": env,
        "ports": [
            {"name": ENGINE_PORT_NAME, "containerPort": cfg.engine_port, "protocol": "TCP"},
            {"name": PROBE_PORT_NAME, "containerPort": cfg.probe_port, "protocol": "TCP"},
        ],
        "startupProbe": {
            "httpGet": {"path": "/readyz", "port": PROBE_PORT_NAME},
            "periodSeconds": startup_period_s,
            "failureThreshold": max(1, startup_s // startup_period_s),
        },
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": PROBE_PORT_NAME},
            "periodSeconds": 2,
            "failureThreshold": 2,
        },
        # The prober turns /livez 503 only when probes stop completing (a hung engine), never
        # because the pod is busy; so a few failures in a row are enough to restart it.
        "livenessProbe": {
            "httpGet": {"path": "/livez", "port": PROBE_PORT_NAME},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(cfg.prestop_sleep_s)]}}},
        "resources": resources,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            # vLLM writes compile and download caches under $HOME; the simulated engine writes nothing
            "readOnlyRootFilesystem": not vllm,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": d.name,
            "namespace": cfg.namespace,
            "labels": labels,
            "annotations": {TARGET_CONCURRENCY_ANNOTATION: str(d.target_concurrency)},
        },
        "spec": {
            "replicas": d.replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": {DEPLOYMENT_LABEL: d.name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,  # runtime pods never call the API server
                    "enableServiceLinks": False,  # one Service per deployment: no env var per Service
                    "terminationGracePeriodSeconds": cfg.termination_grace_s,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 10001,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": {DEPLOYMENT_LABEL: d.name}},
                        }
                    ],
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def _with_grace(args: tuple[str, ...], grace_s: int) -> list[str]:
    """The pod's own drain time goes before a `--` (after it, arguments are vLLM's)."""
    cut = args.index("--") if "--" in args else len(args)
    return [*args[:cut], "--grace", str(grace_s), *args[cut:]]


def events_secret_name(name: str) -> str:
    return f"{name}-events"


def events_secret_manifest(d: Deployment, cfg: RuntimePodConfig) -> Obj | None:
    """The Secret holding `d`'s events credential for its pods (MU_POD_EVENTS_KEY); None when
    its pods post no events (no events_url) or it has no credential."""
    if not (cfg.events_url and d.events_key):
        return None
    check_name(d.name)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": events_secret_name(d.name), "namespace": cfg.namespace, "labels": labels_of(d)},
        "type": "Opaque",
        "stringData": {"key": d.events_key},
    }


def service_manifest(d: Deployment, cfg: RuntimePodConfig) -> Obj:
    """The headless Service whose EndpointSlices routers watch for `d`'s pods."""
    check_name(d.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": d.name, "namespace": cfg.namespace, "labels": labels_of(d)},
        "spec": {
            "clusterIP": "None",  # routers dial pods directly; no virtual IP, no kube-proxy rules
            "selector": {DEPLOYMENT_LABEL: d.name},
            "ports": [{"name": ENGINE_PORT_NAME, "port": cfg.engine_port, "targetPort": ENGINE_PORT_NAME}],
        },
    }


def manifest_hash(*objects: Obj) -> str:
    """A stable digest of what we would send (key order does not matter)."""
    return hashlib.sha256(json.dumps(objects, sort_keys=True).encode()).hexdigest()


# --- reading pods


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _condition(pod: Obj, kind: str) -> Obj | None:
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


def pod_ready(pod: Obj) -> bool:
    """Ready condition True and not being deleted (a terminating pod takes no new requests)."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    ready = _condition(pod, "Ready")
    return ready is not None and ready.get("status") == "True"


def pod_state(pod: Obj, engine_port: int) -> PodState | None:
    """The driver's view of a pod; None for a pod that is not ours or has no IP yet (nothing
    could route to it)."""
    meta = pod.get("metadata", {})
    labels = meta.get("labels") or {}
    deployment = labels.get(DEPLOYMENT_LABEL)
    ip = pod.get("status", {}).get("podIP")
    if not deployment or not ip:
        return None
    host = f"[{ip}]" if ":" in ip else ip
    statuses = pod.get("status", {}).get("containerStatuses") or []
    ready = pod_ready(pod)
    ready_after_s = None
    started = _time(pod.get("status", {}).get("startTime"))
    became_ready = _time((_condition(pod, "Ready") or {}).get("lastTransitionTime"))
    if ready and started and became_ready:
        ready_after_s = max(0.0, (became_ready - started).total_seconds())
    return PodState(
        name=str(meta.get("name")),
        deployment=str(deployment),
        url=f"http://{host}:{engine_port}",
        ready=ready,
        restarts=sum(int(s.get("restartCount", 0)) for s in statuses),
        ready_after_s=ready_after_s,
    )


def pod_events(old: Obj | None, new: Obj, baseline: bool = True) -> list[PodEvent]:
    """What on-call must hear about from one pod status change: a `restart` per container whose
    restartCount went up (with why the last run ended) and a `crash_loop` when a container enters
    CrashLoopBackOff.

    `old` is the pod as last seen. With no `old`, `baseline` says how to read the pod: True (a
    pod first seen at start-up) takes its counts as history, reporting nothing; False (a pod
    that appeared after that, by a watch event or a relist) compares against a fresh pod, so a
    restart that happened while the watch was down is still reported.

    Worked example: old restartCount 2, new 3, lastState.terminated {reason: Error, exitCode:
    137} -> restart "pod ep-42-x container pod restarted (restart #3): Error, exit code 137"."""
    if old is None and baseline:
        return []
    meta = new.get("metadata", {})
    name = str(meta.get("name", "?"))
    labels = meta.get("labels") or {}
    # the deployment's labels (mu/endpoint, mu/version, mu/tenant) say whose pod this is
    endpoint, version, tenant = attribution(
        {
            k[len(LABEL_PREFIX) :]: v
            for k, v in labels.items()
            if isinstance(k, str) and k.startswith(LABEL_PREFIX)
        }
    )
    before = {s.get("name"): s for s in ((old or {}).get("status", {}).get("containerStatuses") or [])}
    events = []
    for status in new.get("status", {}).get("containerStatuses") or []:
        container = status.get("name", "?")
        prev = before.get(container, {})
        restarts = int(status.get("restartCount", 0))
        prev_restarts = int(prev.get("restartCount", 0))
        if restarts > prev_restarts:
            last = (status.get("lastState") or {}).get("terminated") or {}
            why = last.get("reason") or "unknown reason"
            if last.get("exitCode") is not None:
                why += f", exit code {last['exitCode']}"
            events.append(
                PodEvent(
                    "restart",
                    "warning",
                    name,
                    f"pod {name} container {container} restarted (restart #{restarts}): {why}",
                    endpoint,
                    {
                        "container": container,
                        "restarts": restarts,
                        "new_restarts": restarts - prev_restarts,
                        "reason": last.get("reason"),
                        "exit_code": last.get("exitCode"),
                        "finished_at": last.get("finishedAt"),
                        "source": "kubernetes",
                    },
                    version=version,
                    tenant=tenant,
                )
            )
        waiting = (status.get("state") or {}).get("waiting") or {}
        prev_waiting = (prev.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CrashLoopBackOff" and prev_waiting.get("reason") != "CrashLoopBackOff":
            events.append(
                PodEvent(
                    "crash_loop",
                    "critical",
                    name,
                    f"pod {name} container {container} is in CrashLoopBackOff after {restarts} restarts: "
                    f"{waiting.get('message') or 'back-off restarting failed container'}",
                    endpoint,
                    {"container": container, "restarts": restarts, "source": "kubernetes"},
                    version=version,
                    tenant=tenant,
                )
            )
    return events
