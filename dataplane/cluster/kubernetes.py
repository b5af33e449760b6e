"""The Kubernetes cluster driver: `ClusterDriver` over the official `kubernetes` client.

    driver = KubernetesDriver(RuntimePodConfig(namespace="mu-runtime"))     # in-cluster or kubeconfig
    driver.apply([Deployment("ep-42", 2, "sim", ("--profile", "h100-llama-8b"), 8, {"endpoint": "42"})])
    driver.scale("ep-42", 3)                # the scale subresource
    driver.set_target_concurrency("ep-42", 6)   # an annotation: no pod restarts
    driver.list_pods()                      # [PodState(...)], ready from the Ready condition

One apps/v1 Deployment and one headless Service per `Deployment` (see `k8s_objects` for their
shape and why the Service), in one namespace, all labelled
`app.kubernetes.io/managed-by=mu-controlplane`:

- `apply` is server-side apply (`PATCH`, `application/apply-patch+yaml`, fieldManager
  `mu-controlplane`, force: the control plane is the one owner of these fields). What was
  applied is remembered as a hash per deployment, and an apply that would send the same
  objects sends nothing: the autoscaler declares every deployment every 5 s, and most passes
  change nothing. Deployments and Services we labelled but no longer declare are deleted
  (prune), when the declared set changes. Every `resync_s` everything is sent again and
  pruned, which heals what someone changed or deleted behind our back.
- `scale` patches `deployments/{name}/scale`; `set_target_concurrency` patches the
  `mu/target-concurrency` annotation on the Deployment (not its pod template: no rollout).
- 409 Conflict (and 429 throttling) are retried a few times with backoff; any other refusal,
  and an unreachable API server, raise `ClusterError` naming the call and the answer.

`PodWatcher` list-watches the same pods (`kubewatch.Reflector`: resourceVersion, bookmarks,
relist on 410) and turns container restarts and CrashLoopBackOff into on-call events
(`k8s_objects.pod_events`) through a callback; `python manage.py watch_pods` records them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from dataplane.cluster.driver import ClusterError, Deployment, PodState
from dataplane.cluster.k8s_objects import (
    MANAGED_SELECTOR,
    MANAGER,
    TARGET_CONCURRENCY_ANNOTATION,
    Obj,
    RuntimePodConfig,
    deployment_manifest,
    events_secret_manifest,
    events_secret_name,
    manifest_hash,
    pod_events,
    pod_state,
    service_manifest,
)
from dataplane.cluster.kubewatch import Reflector, api_client_from_environment, status_of
from dataplane.wire.pod_events import PodEvent

log = logging.getLogger("dataplane.cluster.kubernetes")

RETRIED_STATUSES = (409, 429)  # a concurrent writer, or API priority and fairness throttling


class KubernetesDriver:
    def __init__(
        self,
        config: RuntimePodConfig,
        api_client: Any = None,
        *,
        retries: int = 4,
        backoff_s: float = 0.1,
        request_timeout_s: float = 10.0,
        resync_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        from kubernetes import client

        self.config = config
        self.namespace = config.namespace
        if api_client is None:
            try:
                api_client = api_client_from_environment()
            except Exception as exc:  # ConfigException, a missing or unreadable kubeconfig
                raise ClusterError(
                    f"no Kubernetes configuration (in-cluster or $KUBECONFIG): {exc}"
                ) from None
        self.api_client = api_client
        self.apps = client.AppsV1Api(self.api_client)
        self.core = client.CoreV1Api(self.api_client)
        self.retries = retries  # extra attempts after a 409/429, count
        self.backoff_s = backoff_s  # first retry delay, doubling, s
        # (connect, read), s: the client ignores a plain float (only an int or a pair count)
        self._timeout = (request_timeout_s, request_timeout_s)
        self.resync_s = resync_s  # send everything again and prune at least this often, s
        self.clock = clock
        self.sleep = sleep
        self._lock = threading.Lock()
        self._applied: dict[str, str] = {}  # deployment name -> hash of what we last applied
        self._declared: frozenset[str] | None = None  # names at the last successful prune
        self._synced_at: float | None = None  # clock() of the last full resync

    # --- ClusterDriver

    def apply(self, deployments: Sequence[Deployment]) -> None:
        with self._lock:
            now = self.clock()
            if self._synced_at is None or now - self._synced_at >= self.resync_s:
                self._applied.clear()
                self._declared = None
                self._synced_at = now
            for d in deployments:
                try:
                    deployment, service, secret = (
                        deployment_manifest(d, self.config),
                        service_manifest(d, self.config),
                        events_secret_manifest(d, self.config),
                    )
                except ValueError as exc:
                    raise ClusterError(
                        f"deployment {d.name} cannot be expressed in Kubernetes: {exc}"
                    ) from None
                digest = manifest_hash(deployment, service, secret or {})
                if self._applied.get(d.name) == digest:
                    continue
                self._applied.pop(d.name, None)
                if secret is not None:  # before the pods that read it
                    path = f"/api/v1/namespaces/{self.namespace}/secrets/{secret['metadata']['name']}"
                    self._server_side_apply(path, secret)
                self._server_side_apply(f"/api/v1/namespaces/{self.namespace}/services/{d.name}", service)
                self._server_side_apply(
                    f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{d.name}", deployment
                )
                self._applied[d.name] = digest
            declared = frozenset(d.name for d in deployments) | frozenset(
                events_secret_name(d.name) for d in deployments if d.events_key
            )
            if declared != self._declared:
                self._prune(declared)
                self._declared = declared

    def scale(self, name: str, replicas: int) -> None:
        self._call(
            f"scale deployment {name} to {replicas}",
            lambda: self.apps.patch_namespaced_deployment_scale(
                name,
                self.namespace,
                {"spec": {"replicas": replicas}},
                field_manager=MANAGER,
                _preload_content=False,
                _request_timeout=self._timeout,
            ),
        )
        with self._lock:
            self._applied.pop(name, None)  # the next apply sends its count again, whatever it is

    def set_target_concurrency(self, name: str, target: int) -> None:
        body = {"metadata": {"annotations": {TARGET_CONCURRENCY_ANNOTATION: str(target)}}}
        self._call(
            f"annotate deployment {name} with target concurrency {target}",
            lambda: self.apps.patch_namespaced_deployment(
                name,
                self.namespace,
                body,
                field_manager=MANAGER,
                _preload_content=False,
                _request_timeout=self._timeout,
            ),
        )
        with self._lock:
            self._applied.pop(name, None)

    def list_pods(self) -> list[PodState]:
        doc = self._call(
            "list pods", partial(self.core.list_namespaced_pod, self.namespace, **self._list_options())
        )
        states = (pod_state(p, self.config.engine_port) for p in doc.get("items") or [])
        return sorted((s for s in states if s is not None), key=lambda s: s.name)

    # --- the calls

    def _server_side_apply(self, path: str, body: Obj) -> None:
        what = f"apply {body['kind']} {body['metadata']['name']}"
        self._call(
            what,
            lambda: self.api_client.call_api(
                path,
                "PATCH",
                path_params={},
                query_params=[("fieldManager", MANAGER), ("force", "true")],
                header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
                body=body,  # JSON is YAML: the client sends it as JSON text
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=False,
                _request_timeout=self._timeout,
            ),
        )

    def _prune(self, declared: frozenset[str]) -> None:
        kinds: list[tuple[str, Callable[..., Any], Callable[..., Any]]] = [
            ("Deployment", self.apps.list_namespaced_deployment, self.apps.delete_namespaced_deployment),
            ("Service", self.core.list_namespaced_service, self.core.delete_namespaced_service),
            ("Secret", self.core.list_namespaced_secret, self.core.delete_namespaced_secret),
        ]
        for kind, lister, deleter in kinds:
            doc = self._call(f"list {kind}s", partial(lister, self.namespace, **self._list_options()))
            for item in doc.get("items") or []:
                name = item["metadata"]["name"]
                if name in declared:
                    continue
                log.info("pruning %s %s/%s: no longer declared", kind, self.namespace, name)
                delete = partial(
                    deleter,
                    name,
                    self.namespace,
                    body={"propagationPolicy": "Background"},
                    _preload_content=False,
                    _request_timeout=self._timeout,
                )
                self._call(f"delete {kind} {name}", delete, missing_ok=True)
                self._applied.pop(name, None)

    def _list_options(self) -> dict[str, Any]:
        return {
            "label_selector": MANAGED_SELECTOR,
            "_preload_content": False,
            "_request_timeout": self._timeout,
        }

    def _call(self, what: str, request: Callable[[], Any], missing_ok: bool = False) -> Obj:
        """Run one API call: retry 409/429 with backoff, decode the JSON answer, and turn every
        other failure into ClusterError."""
        attempt = 0
        while True:
            try:
                resp = request()
            except Exception as exc:
                status = status_of(exc)
                if status in RETRIED_STATUSES and attempt < self.retries:
                    delay = self.backoff_s * 2**attempt
                    attempt += 1
                    log.info("%s: %s, retry %d in %.2f s", what, status, attempt, delay)
                    self.sleep(delay)
                    continue
                if status == 404 and missing_ok:
                    return {}
                raise ClusterError(self._describe(what, exc, attempt)) from None
            try:
                data = resp.data
                return dict(json.loads(data)) if data else {}
            except ValueError as exc:
                raise ClusterError(f"kubernetes {what}: the answer is not JSON: {exc}") from None
            finally:
                resp.release_conn()

    def _describe(self, what: str, exc: BaseException, retries: int) -> str:
        status = status_of(exc)
        if status is None:
            return f"kubernetes API server unreachable ({what}): {type(exc).__name__}: {exc}"
        message = getattr(exc, "reason", "") or ""
        body = getattr(exc, "body", None)
        try:
            message = json.loads(body).get("message") or message if isinstance(body, str | bytes) else message
        except (ValueError, AttributeError):
            pass
        after = f" after {retries} retries" if retries else ""
        return f"kubernetes {what} in namespace {self.namespace}: {status} {message}{after}"


class PodWatcher:
    """Watch the runtime pods; call `on_event` with a `restart` or `crash_loop` event when a
    container restarts or enters CrashLoopBackOff. Runs until `stop()`; survives the API server
    going away (it resumes, or relists on 410, and reports what changed meanwhile)."""

    def __init__(
        self,
        namespace: str,
        on_event: Callable[[PodEvent], None],
        api_client: Any = None,
        *,
        label_selector: str = MANAGED_SELECTOR,
        watch_timeout_s: int = 290,
        backoff_base_s: float = 0.5,
    ) -> None:
        from kubernetes import client

        self.on_event = on_event
        api = client.CoreV1Api(api_client if api_client is not None else api_client_from_environment())
        self.reflector = Reflector(
            api.list_namespaced_pod,
            namespace,
            label_selector=label_selector,
            on_list=self._listed,
            on_event=self._changed,
            watch_timeout_s=watch_timeout_s,
            backoff_base_s=backoff_base_s,
            name="pods",
        )

    def _listed(self, old: Any, new: Any, initial: bool) -> None:
        for name, pod in new.items():
            self._emit(pod_events(old.get(name), pod, baseline=initial))

    def _changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if new is not None:
            self._emit(pod_events(old, new, baseline=False))

    def _emit(self, events: list[PodEvent]) -> None:
        for event in events:
            try:
                self.on_event(event)
            except Exception:  # a failing sink must not stop the watch; the event is logged
                log.exception("pod event not recorded: %s", event.message)

    def run(self) -> None:
        self.reflector.run()

    def stop(self) -> None:
        self.reflector.stop()
