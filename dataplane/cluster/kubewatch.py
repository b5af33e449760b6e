"""List-then-watch one kind of Kubernetes object in one namespace, with the official client.

`Reflector` is what client-go's informers do, for one resource: list (which gives a
resourceVersion), then watch from that resourceVersion with `allowWatchBookmarks`, applying
ADDED / MODIFIED / DELETED to a local cache and calling back. It is what the pod watcher
(`dataplane.cluster.kubernetes.PodWatcher`) and the routers' EndpointSlice discovery
(`dataplane.router.endpointslices`) run, each in a thread of its own.

- Every event and every BOOKMARK advances the resourceVersion, so a watch that ends (the
  server's timeout, a dropped connection) resumes where it was, missing nothing and repeating
  nothing. Bookmarks matter on quiet resources: without them, the last resourceVersion we
  know can be compacted away while nothing we watch changes, and the next resume gets 410.
- 410 Gone (as the watch request's status, or as an ERROR event in the stream, which is how
  an API server usually says it) means our resourceVersion is too old: relist. The relist is
  handed to `on_list` with the cache as it was, so a change that happened while we were not
  watching is still seen as a change (the pod watcher reports a restart it did not watch).
- An API server that cannot be reached: back off (0.5 s doubling to 30 s, jittered) and resume
  from the same resourceVersion; the cache, and whoever reads it, keep the last good state.

We drive the watch ourselves instead of `kubernetes.watch.Watch`: that helper (client 35)
ignores bookmarks' resourceVersion and retries a 410 once with the same, expired
resourceVersion. We still call the client's generated `list_*` functions, so kubeconfig,
in-cluster tokens, TLS and proxies are the client's, and read raw JSON (`_preload_content=False`):
plain dicts, no model deserialisation.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dataplane.cluster.k8s_objects import Obj

log = logging.getLogger("dataplane.cluster.kubewatch")

ListFunction = Callable[..., Any]  # e.g. CoreV1Api().list_namespaced_pod
OnList = Callable[[Mapping[str, Obj], Mapping[str, Obj], bool], None]  # old cache, new cache, initial
OnEvent = Callable[[str, Obj | None, Obj | None], None]  # ADDED/MODIFIED/DELETED, old, new


class Gone(Exception):
    """410: the resourceVersion we watch from is older than what the API server keeps."""


class WatchError(Exception):
    """The API server answered a watch or list with an error (other than 410)."""


def api_client_from_environment(context: str | None = None, retries: int = 1) -> Any:
    """An `ApiClient` for the cluster we run in (service-account token) or, outside one, the
    current kubeconfig (`$KUBECONFIG` or ~/.kube/config, optionally another context)."""
    import os

    from kubernetes import client, config

    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        # $KUBECONFIG read now: the client reads it once, when it is first imported
        config_file = os.environ.get("KUBECONFIG") or None
        config.load_kube_config(config_file=config_file, context=context, client_configuration=configuration)
    configuration.retries = retries  # our callers retry with backoff; urllib3's default is 3
    return client.ApiClient(configuration)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a client ApiException, None for anything else (network errors)."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and status > 0 else None


def iter_lines(resp: Any) -> Iterator[bytes]:
    """Newline-separated JSON documents of a watch stream, as they arrive."""
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk
        while True:
            line, sep, rest = buffer.partition(b"\n")
            if not sep:
                break
            buffer = rest
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


class Reflector:
    """List and watch objects of one kind; `cache` maps name -> object (one namespace)."""

    def __init__(
        self,
        list_function: ListFunction,
        namespace: str,
        *,
        label_selector: str = "",
        on_list: OnList | None = None,
        on_event: OnEvent | None = None,
        watch_timeout_s: int = 290,
        request_timeout_s: float = 10.0,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        name: str = "objects",
    ) -> None:
        self.list_function = list_function
        self.namespace = namespace
        self.label_selector = label_selector
        self.on_list = on_list
        self.on_event = on_event
        self.watch_timeout_s = watch_timeout_s  # the server ends each watch after this, s
        self.request_timeout_s = request_timeout_s  # connect (and list read) timeout, s
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.name = name  # for logs: "pods", "endpointslices"
        self.cache: dict[str, Obj] = {}
        self.resource_version: str | None = None
        self.synced = False  # a list has succeeded at least once
        self.lists = 0  # successful lists (the first one, then one per 410), count
        self.bookmarks = 0  # bookmarks received, count
        self.failures = 0  # consecutive failed calls, count
        self._stop = threading.Event()
        self._response: Any = None
        self._rng = random.Random()

    # --- one step each (tests call these directly)

    def list_once(self) -> None:
        """List everything, replace the cache, and remember the list's resourceVersion."""
        resp = self._call(watch=False)
        try:
            doc = json.loads(resp.data)
        except ValueError as exc:
            raise WatchError(f"list {self.name}: not JSON: {exc}") from None
        finally:
            resp.release_conn()
        items = {item["metadata"]["name"]: item for item in doc.get("items") or []}
        old, initial = self.cache, not self.synced
        self.cache = items
        self.resource_version = str(doc.get("metadata", {}).get("resourceVersion") or "") or None
        self.synced = True
        self.lists += 1
        if self.on_list is not None:
            self.on_list(old, items, initial)

    def watch_once(self) -> int:
        """One watch request from the current resourceVersion, until the server ends it.
        Returns the number of events (bookmarks included). Raises Gone on 410."""
        resp = self._call(watch=True)
        self._response = resp
        count = 0
        try:
            # stop() sets the flag, then reads _response: checking the flag after publishing the
            # response means a stop that raced the request either sees it or is seen here
            if self._stop.is_set():
                return count
            for line in iter_lines(resp):
                if self._stop.is_set():
                    break
                try:
                    event = json.loads(line)
                except ValueError:
                    log.warning("watch %s: skipping a line that is not JSON: %.200r", self.name, line)
                    continue
                count += 1
                self._apply(event)
        finally:
            self._response = None
            resp.release_conn()
        return count

    def _apply(self, event: Obj) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise Gone(obj.get("message", "resource version too old"))
            raise WatchError(f"watch {self.name}: {code} {obj.get('reason')}: {obj.get('message')}")
        version = obj.get("metadata", {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if version:
                self.resource_version = str(version)
            self.bookmarks += 1
            return
        name = obj.get("metadata", {}).get("name")
        if kind not in ("ADDED", "MODIFIED", "DELETED") or not name:
            log.warning("watch %s: ignoring event %r", self.name, kind)
            return
        old = self.cache.get(name)
        if kind == "DELETED":
            self.cache.pop(name, None)
            new = None
        else:
            self.cache[name] = obj
            new = obj
        if version:
            self.resource_version = str(version)
        if self.on_event is not None:
            self.on_event(str(kind), old, new)

    def _call(self, watch: bool) -> Any:
        kwargs: dict[str, Any] = {"_preload_content": False}
        if self.label_selector:
            kwargs["label_selector"] = self.label_selector
        if watch:
            kwargs.update(
                watch=True,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout_s,
                # the read timeout outlives the server's own timeout: a silent stream is a dead one
                _request_timeout=(self.request_timeout_s, self.watch_timeout_s + 30),
            )
        else:
            kwargs["_request_timeout"] = (self.request_timeout_s, self.request_timeout_s * 3)
        try:
            return self.list_function(self.namespace, **kwargs)
        except Exception as exc:
            if status_of(exc) == 410:
                raise Gone(f"410 {getattr(exc, 'reason', '') or 'Gone'}") from None
            raise

    # --- the loop

    def run(self) -> None:
        """List, then watch until `stop()`; never raises on API errors."""
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self.list_once()
                started = time.monotonic()
                events = self.watch_once()
                self.failures = 0
                if events == 0 and time.monotonic() - started < 1.0:
                    self._stop.wait(self.backoff_base_s)  # a server that hangs up at once: no spin
            except Gone as exc:
                log.info("watch %s: %s; relisting", self.name, exc)
                self.resource_version = None
            except Exception as exc:  # unreachable, 5xx, 403, garbage: keep the cache, retry later
                if self._stop.is_set():
                    break
                self.failures += 1
                delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** (self.failures - 1))
                delay *= 0.8 + 0.4 * self._rng.random()
                log.warning(
                    "watch %s failed (%s: %s); keeping the last state, retrying in %.1f s",
                    self.name,
                    type(exc).__name__,
                    exc,
                    delay,
                )
                self._stop.wait(delay)

    def stop(self) -> None:
        """Ask `run` to return; unblocks a watch waiting for its next event."""
        self._stop.set()
        resp = self._response
        if resp is not None:
            try:
                resp.shutdown()  # urllib3 >= 2.3: wakes a read blocked on the socket
            except Exception:  # older urllib3, or already closed: the read timeout ends it
                pass
