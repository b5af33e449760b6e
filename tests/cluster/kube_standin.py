"""A stand-in Kubernetes API server for tests: a real HTTP/1.1 server on 127.0.0.1 speaking
exactly the calls the Kubernetes driver, the pod watcher and the EndpointSlice discovery make,
reached through a real `kubernetes.client.ApiClient` (`standin.api_client()`).

It serves deployments (apps/v1), services and pods (v1) and endpointslices (discovery.k8s.io/v1),
namespaced: lists by label selector, watches, server-side apply and merge patches, the scale
subresource and deletes (the calls, and what a test can do to it: `KubeStandIn`). One
resourceVersion counter for everything, like etcd's revision; every change is logged and watches
replay the log after their resourceVersion. It is not an API server: no validation, no
defaulting, no field ownership; just enough that the clients' side of each call is real.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

Obj = dict[str, Any]

PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))/namespaces/(?P<ns>[^/]+)/"
    r"(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>scale))?$"
)
KINDS = {
    "deployments": ("apps/v1", "Deployment"),
    "services": ("v1", "Service"),
    "secrets": ("v1", "Secret"),
    "pods": ("v1", "Pod"),
    "endpointslices": ("discovery.k8s.io/v1", "EndpointSlice"),
}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any


@dataclass
class Fault:
    method: str
    path: str  # substring of the request path
    status: int
    times: int
    message: str


@dataclass
class Entry:
    rv: int
    resource: str | None  # None: a bookmark, for every watch
    namespace: str
    type: str
    obj: Obj


@dataclass
class _Watch:
    generation: int
    allow_bookmarks: bool
    since: int
    done: threading.Event = field(default_factory=threading.Event)


def matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality (`a=b`, `a==b`), inequality (`a!=b`) and existence (`a`, `!a`) terms."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def merge(target: Obj, patch: Obj) -> Obj:
    """JSON merge patch (RFC 7386): None deletes, dicts merge, the rest replaces."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)
    return target


class KubeStandIn:
    """Served, for deployments, services, pods and endpointslices, namespaced:

        GET    .../{resource}?labelSelector=           list, with metadata.resourceVersion
        GET    .../{resource}?watch=true&resourceVersion=&allowWatchBookmarks=&timeoutSeconds=
               a chunked stream of {"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...}
        PATCH  .../{resource}/{name}                   server-side apply (application/apply-patch+yaml;
                                                       creates or replaces labels, annotations, spec)
                                                       or a merge patch (anything else)
        PATCH  .../deployments/{name}/scale            spec.replicas
        DELETE .../{resource}/{name}

    What a test can do to it:

        put / delete / get           change objects behind the clients' backs (as controllers do)
        fail(method, path, status)   answer the next matching request(s) with an error (409 ...)
        bookmark()                   send a BOOKMARK with the current resourceVersion to watches
        compact(change, how)         forget history up to now (after `change`, which no watch
                                     sees): open watches get ERROR 410 (how="event"), or new ones
                                     from an old resourceVersion get HTTP 410 (how="status")
        end_watches()                end every open watch normally (as the server's timeout does)
        requests                     every request, in order (method, path, query, content type, body)
        gone_answers                 how each 410 was given ("event" or "status")
    """

    def __init__(self) -> None:
        self.rv = 100
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.log: list[Entry] = []
        self.floor = 0  # watches from a resourceVersion below this get 410
        self.gone_how = "event"
        self.generation = 0  # bumped by end_watches/compact: open watches end
        self.requests: list[Request] = []
        self.gone_answers: list[str] = []  # "event" or "status", per watch refused with 410
        self.faults: list[Fault] = []
        self.watches: list[_Watch] = []
        self.cond = threading.Condition()
        self._stopping = False
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                standin._handle(self, "GET")

            def do_PATCH(self) -> None:
                standin._handle(self, "PATCH")

            def do_DELETE(self) -> None:
                standin._handle(self, "DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    # --- lifecycle

    def start(self) -> KubeStandIn:
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.cond:
            self._stopping = True
            self.generation += 1
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def api_client(self) -> Any:
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        configuration.retries = 0  # a refused connection fails at once
        return client.ApiClient(configuration)

    # --- what tests do to it

    def put(self, resource: str, obj: Obj, namespace: str = "mu-runtime") -> Obj:
        with self.cond:
            return self._put(resource, namespace, copy.deepcopy(obj))

    def delete(self, resource: str, name: str, namespace: str = "mu-runtime") -> None:
        with self.cond:
            self._delete(resource, namespace, name)

    def get(self, resource: str, name: str, namespace: str = "mu-runtime") -> Obj | None:
        with self.cond:
            obj = self.objects.get((resource, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def names(self, resource: str, namespace: str = "mu-runtime") -> list[str]:
        with self.cond:
            return sorted(n for (r, ns, n) in self.objects if r == resource and ns == namespace)

    def fail(self, method: str, path: str, status: int, times: int = 1, message: str = "injected") -> None:
        with self.cond:
            self.faults.append(Fault(method, path, status, times, message))

    def bookmark(self) -> None:
        with self.cond:
            self.log.append(Entry(self.rv, None, "", "BOOKMARK", {}))
            self.cond.notify_all()

    def end_watches(self) -> None:
        with self.cond:
            self.generation += 1
            self.cond.notify_all()

    def compact(self, change: Callable[[], None] | None = None, how: str = "event") -> None:
        """End open watches, apply `change` (calls to put/delete) before any client can watch
        again, and forget the history: a watch from an older resourceVersion gets 410, as an
        ERROR event in a 200 stream (how="event") or as the response's status (how="status")."""
        with self.cond:  # re-entrant use of put/delete below: they take the same lock
            self.generation += 1
            self.gone_how = how
            if change is not None:
                change()
            self.floor = self.rv
            self.cond.notify_all()

    def wait_for_watches(self, count: int = 1, timeout: float = 5.0) -> None:
        """Until `count` watches are open (a test's change then reaches them as an event)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while sum(1 for w in self.watches if not w.done.is_set()) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"fewer than {count} watches opened within {timeout} s")
                self.cond.wait(left)

    def mutating_requests(self) -> list[Request]:
        return [r for r in self.requests if r.method != "GET"]

    # --- the store (callers hold self.cond)

    def _next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def _put(self, resource: str, namespace: str, obj: Obj) -> Obj:
        meta = obj.setdefault("metadata", {})
        name = meta["name"]
        api_version, kind = KINDS[resource]
        obj.setdefault("apiVersion", api_version)
        obj.setdefault("kind", kind)
        meta["namespace"] = namespace
        existing = self.objects.get((resource, namespace, name))
        meta.setdefault("uid", (existing or {}).get("metadata", {}).get("uid") or str(uuid.uuid4()))
        rv = self._next_rv()
        meta["resourceVersion"] = str(rv)
        self.objects[(resource, namespace, name)] = obj
        self.log.append(
            Entry(rv, resource, namespace, "MODIFIED" if existing else "ADDED", copy.deepcopy(obj))
        )
        self.cond.notify_all()
        return obj

    def _delete(self, resource: str, namespace: str, name: str) -> Obj | None:
        obj = self.objects.pop((resource, namespace, name), None)
        if obj is None:
            return None
        rv = self._next_rv()
        obj["metadata"]["resourceVersion"] = str(rv)
        self.log.append(Entry(rv, resource, namespace, "DELETED", copy.deepcopy(obj)))
        self.cond.notify_all()
        return obj

    # --- HTTP

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        length = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length else b""
        content_type = h.headers.get("content-type", "")
        body = json.loads(raw) if raw else None
        with self.cond:
            self.requests.append(Request(method, parts.path, query, content_type, body))
            fault = next(
                (f for f in self.faults if f.method == method and f.path in parts.path and f.times > 0), None
            )
            if fault is not None:
                fault.times -= 1
        if fault is not None:
            return self._status(h, fault.status, fault.message)
        m = PATH.match(parts.path)
        if m is None or m["resource"] not in KINDS:
            return self._status(h, 404, f"no route for {parts.path}")
        resource, ns, name, sub = m["resource"], m["ns"], m["name"], m["sub"]
        if method == "GET" and name is None:
            if query.get("watch", "").lower() in ("true", "1"):
                return self._watch(h, resource, ns, query)
            return self._list(h, resource, ns, query)
        if method == "PATCH" and name is not None:
            return self._patch(h, resource, ns, name, sub, content_type, query, body or {})
        if method == "DELETE" and name is not None:
            with self.cond:
                gone = self._delete(resource, ns, name)
            if gone is None:
                return self._status(h, 404, f'{resource} "{name}" not found')
            return self._json(h, 200, gone)
        return self._status(h, 405, f"{method} {parts.path} is not served here")

    def _list(self, h: BaseHTTPRequestHandler, resource: str, ns: str, query: dict[str, str]) -> None:
        selector = query.get("labelSelector", "")
        with self.cond:
            items = [
                copy.deepcopy(o)
                for (r, n, _), o in sorted(self.objects.items())
                if r == resource and n == ns and matches(selector, o["metadata"].get("labels") or {})
            ]
            rv = self.rv
        api_version, kind = KINDS[resource]
        doc = {
            "apiVersion": api_version,
            "kind": kind + "List",
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }
        self._json(h, 200, doc)

    def _patch(
        self,
        h: BaseHTTPRequestHandler,
        resource: str,
        ns: str,
        name: str,
        sub: str | None,
        content_type: str,
        query: dict[str, str],
        body: Obj,
    ) -> None:
        with self.cond:
            existing = self.objects.get((resource, ns, name))
            if sub == "scale":
                if existing is None:
                    return self._status(h, 404, f'deployments.apps "{name}" not found')
                obj = copy.deepcopy(existing)
                obj["spec"]["replicas"] = int(body["spec"]["replicas"])
                obj = self._put(resource, ns, obj)
                scale = {
                    "apiVersion": "autoscaling/v1",
                    "kind": "Scale",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"replicas": obj["spec"]["replicas"]},
                }
                return self._json(h, 200, scale)
            if content_type.startswith("application/apply-patch"):
                if "fieldManager" not in query:
                    return self._status(h, 422, "fieldManager is required for apply requests")
                obj = copy.deepcopy(existing) if existing else {"metadata": {"name": name}}
                for key in ("labels", "annotations"):
                    if key in body.get("metadata", {}):
                        obj["metadata"][key] = copy.deepcopy(body["metadata"][key])
                    else:
                        obj["metadata"].pop(key, None)
                obj["spec"] = copy.deepcopy(body.get("spec", {}))
                for key in ("type", "stringData"):  # a Secret's
                    if key in body:
                        obj[key] = copy.deepcopy(body[key])
                obj["apiVersion"], obj["kind"] = body.get("apiVersion"), body.get("kind")
                if existing is not None and obj == existing:
                    return self._json(h, 200, copy.deepcopy(existing))  # a no-op apply changes nothing
                return self._json(h, 200 if existing else 201, copy.deepcopy(self._put(resource, ns, obj)))
            if existing is None:
                return self._status(h, 404, f'{resource} "{name}" not found')
            obj = merge(copy.deepcopy(existing), body)
            return self._json(h, 200, copy.deepcopy(self._put(resource, ns, obj)))

    def _watch(self, h: BaseHTTPRequestHandler, resource: str, ns: str, query: dict[str, str]) -> None:
        selector = query.get("labelSelector", "")
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 30)
        bookmarks = query.get("allowWatchBookmarks", "").lower() in ("true", "1")
        with self.cond:
            since = int(query.get("resourceVersion") or self.rv)
            gone, how = since < self.floor, self.gone_how
            if gone:
                self.gone_answers.append(how)
            watch = _Watch(self.generation, bookmarks, since)
            if not gone:
                self.watches.append(watch)
                self.cond.notify_all()
            position = next((i for i, e in enumerate(self.log) if e.rv > since), len(self.log))
        if gone and how == "status":
            return self._status(h, 410, f"too old resource version: {since} ({self.floor})")
        h.send_response(200)
        h.send_header("content-type", "application/json")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        try:
            if gone:  # how an API server usually says it: 200, then one ERROR event
                self._chunk(h, self._gone_event(since))
                return
            while True:
                with self.cond:
                    while (
                        position >= len(self.log)
                        and watch.generation == self.generation
                        and not self._stopping
                        and time.monotonic() < deadline
                    ):
                        self.cond.wait(max(0.0, deadline - time.monotonic()))
                    if watch.generation != self.generation or self._stopping or position >= len(self.log):
                        return  # ended by end_watches/compact, or the timeout: a clean end
                    batch, position = self.log[position:], len(self.log)
                events = []
                for e in batch:
                    if e.resource is None:
                        if watch.allow_bookmarks:
                            events.append(
                                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(e.rv)}}}
                            )
                        continue
                    labels = e.obj["metadata"].get("labels") or {}
                    if e.resource == resource and e.namespace == ns and matches(selector, labels):
                        events.append({"type": e.type, "object": e.obj})
                if events:
                    self._chunk(h, b"".join(json.dumps(ev).encode() + b"\n" for ev in events))
        except OSError:
            pass  # the client went away
        finally:
            try:
                self._chunk(h, b"")  # the last chunk: the response is complete, the connection reusable
            except OSError:
                pass
            watch.done.set()
            with self.cond:
                self.cond.notify_all()

    def _gone_event(self, since: int) -> bytes:
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": f"too old resource version: {since} ({self.floor})",
            "reason": "Expired",
            "code": 410,
        }
        return json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"

    @staticmethod
    def _chunk(h: BaseHTTPRequestHandler, data: bytes) -> None:
        h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        h.wfile.flush()

    @staticmethod
    def _json(h: BaseHTTPRequestHandler, status: int, doc: Obj) -> None:
        data = json.dumps(doc).encode()
        h.send_response(status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    @classmethod
    def _status(cls, h: BaseHTTPRequestHandler, code: int, message: str) -> None:
        reasons = {404: "NotFound", 409: "Conflict", 410: "Expired", 422: "Invalid", 429: "TooManyRequests"}
        doc = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "reason": reasons.get(code, "InternalError"),
            "code": code,
        }
        cls._json(h, code, doc)


# --- objects as controllers would write them


def pod(
    name: str,
    deployment: str = "ep-1",
    endpoint: str = "1",
    ip: str | None = "10.0.0.1",
    ready: bool = True,
    restarts: int = 0,
    waiting: str | None = None,
    terminated: Obj | None = None,
    deleting: bool = False,
) -> Obj:
    container: Obj = {"name": "pod", "restartCount": restarts, "ready": ready}
    container["state"] = (
        {"waiting": {"reason": waiting, "message": "back-off 40s"}} if waiting else {"running": {}}
    )
    if terminated:
        container["lastState"] = {"terminated": terminated}
    meta: Obj = {
        "name": name,
        "labels": {
            "app.kubernetes.io/managed-by": "mu-controlplane",
            "mu/deployment": deployment,
            "mu/endpoint": endpoint,
        },
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    status: Obj = {
        "phase": "Running",
        "startTime": "2026-01-01T00:00:00Z",
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "lastTransitionTime": "2026-01-01T00:00:04Z",
            }
        ],
        "containerStatuses": [container],
    }
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "spec": {}, "status": status}


def endpoint_slice(name: str, endpoint: str, pods: list[tuple[str, str, Obj]], port: int = 8000) -> Obj:
    """`pods`: (pod name, IP, conditions) e.g. ("ep-1-a", "10.0.0.1", {"ready": True})."""
    return {
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/managed-by": "mu-controlplane",
                "mu/endpoint": endpoint,
                "kubernetes.io/service-name": f"ep-{endpoint}",
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "engine", "port": port, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [ip], "conditions": conditions, "targetRef": {"kind": "Pod", "name": pod_name}}
            for pod_name, ip, conditions in pods
        ],
    }


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig whose current context is the stand-in at `server`, as a client reads it."""
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: standin\n"
        f"clusters: [{{name: standin, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: me, user: {token: t}}]\n"
        "contexts: [{name: standin, context: {cluster: standin, user: me}}]\n"
    )
    return path
