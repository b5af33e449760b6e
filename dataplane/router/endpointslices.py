"""Router discovery on Kubernetes: endpoints from the control plane, pods from EndpointSlices.

    ROUTER_KEY=... python -m dataplane.router --control-plane http://controlplane.mu-system.svc \\
        --endpointslices mu-runtime

`EndpointSliceDiscovery` wraps a `ControlPlaneDiscovery` and replaces each endpoint's pods with
those of its EndpointSlices (one watch on `app.kubernetes.io/managed-by=mu-controlplane`), which
Kubernetes updates within milliseconds of a pod's readiness changing; a `terminating` pod is never
routed to, whatever `ready` says. The watch runs in a daemon thread (the official client is
synchronous) and hands each new set of pods to the event loop, which keeps only the latest: the
hot path never waits on the API server. Conditions, fallbacks and why a thread: docs/router.md,
"Pods from EndpointSlices".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import replace
from typing import Any

from dataplane.cluster.k8s_objects import (
    ENDPOINT_LABEL,
    ENGINE_PORT_NAME,
    LABEL_PREFIX,
    MANAGED_SELECTOR,
    Obj,
)
from dataplane.cluster.kubewatch import Reflector, api_client_from_environment
from dataplane.router.discovery import Discovery
from dataplane.wire.routing_table import RoutedPod, RoutingTable

log = logging.getLogger("dataplane.router.endpointslices")

PodsByEndpoint = dict[int, tuple[RoutedPod, ...]]
VERSION_LABEL = LABEL_PREFIX + "version"  # the Deployment's "version" label (ep-42-v3 -> "3")


def slice_pods(slice_: Obj, port_name: str = ENGINE_PORT_NAME) -> tuple[int | None, list[RoutedPod]]:
    """(endpoint id, its pods) of one EndpointSlice; (None, []) when it is not ours or has no
    port of that name."""
    labels = slice_.get("metadata", {}).get("labels") or {}
    endpoint = labels.get(ENDPOINT_LABEL, "")
    if not isinstance(endpoint, str) or not endpoint.isdigit():
        return None, []
    version = str(labels.get(VERSION_LABEL, ""))  # the endpoint version, for the traffic split
    port = next((p.get("port") for p in slice_.get("ports") or [] if p.get("name") == port_name), None)
    if not isinstance(port, int):
        return int(endpoint), []
    pods = []
    for e in slice_.get("endpoints") or []:
        addresses = e.get("addresses") or []
        if not addresses:
            continue
        address = str(addresses[0])
        host = f"[{address}]" if ":" in address else address
        ref = e.get("targetRef") or {}
        name = str(ref.get("name") or address)
        conditions = e.get("conditions") or {}
        ready = conditions.get("ready") is not False and conditions.get("terminating") is not True
        pods.append(RoutedPod(name, f"http://{host}:{port}", ready, version))
    return int(endpoint), pods


def pods_by_endpoint(slices: Iterable[Obj], port_name: str = ENGINE_PORT_NAME) -> PodsByEndpoint:
    found: dict[int, dict[str, RoutedPod]] = {}
    for s in slices:
        endpoint, pods = slice_pods(s, port_name)
        if endpoint is None:
            continue
        seen = found.setdefault(endpoint, {})
        for p in pods:
            other = seen.get(p.name)
            seen[p.name] = p if other is None else replace(p, ready=p.ready and other.ready)
    return {e: tuple(sorted(pods.values(), key=lambda p: p.name)) for e, pods in found.items()}


def with_pods(table: RoutingTable, pods: Mapping[int, tuple[RoutedPod, ...]], version: str) -> RoutingTable:
    """The control plane's table with every endpoint's pods from the slices (none: no pods)."""
    endpoints = tuple(replace(e, pods=pods.get(e.id, ())) for e in table.endpoints)
    return replace(table, version=f"{table.version}+{version}", endpoints=endpoints)


class EndpointSliceDiscovery:
    def __init__(
        self,
        control_plane: Discovery,
        namespace: str,
        api_client: Any = None,
        *,
        label_selector: str = MANAGED_SELECTOR,
        port_name: str = ENGINE_PORT_NAME,
        watch_timeout_s: int = 290,
        backoff_base_s: float = 0.5,
    ) -> None:
        self.control_plane = control_plane
        self.namespace = namespace
        self.api_client = api_client  # None: in-cluster or kubeconfig, made in the watch thread
        self.label_selector = label_selector
        self.port_name = port_name
        self.watch_timeout_s = watch_timeout_s
        self.backoff_base_s = backoff_base_s
        self.reflector: Reflector | None = None
        self.slice_versions = 0  # sets of pods received from the watch, count
        self._table: RoutingTable | None = None
        self._pods: PodsByEndpoint | None = None  # None until the first list
        self._changed: asyncio.Event | None = None
        self._stop = threading.Event()

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """The watch thread: make the client, then list and watch until stopped."""
        from kubernetes import client

        def publish(cache: Mapping[str, Obj]) -> None:
            pods = pods_by_endpoint(cache.values(), self.port_name)
            with contextlib.suppress(RuntimeError):  # the loop closed under us: we are stopping
                loop.call_soon_threadsafe(self._set_pods, pods)

        delay = self.backoff_base_s
        while not self._stop.is_set():
            try:
                api_client = self.api_client if self.api_client is not None else api_client_from_environment()
                break
            except Exception as exc:
                log.error("no Kubernetes configuration (%s); retrying in %.0f s", exc, delay)
                self._stop.wait(delay)
                delay = min(30.0, delay * 2)
        else:
            return
        api = client.DiscoveryV1Api(api_client)
        reflector = Reflector(
            api.list_namespaced_endpoint_slice,
            self.namespace,
            label_selector=self.label_selector,
            on_list=lambda old, new, initial: publish(new),
            on_event=lambda kind, old, new: publish(reflector.cache),
            watch_timeout_s=self.watch_timeout_s,
            backoff_base_s=self.backoff_base_s,
            name="endpointslices",
        )
        self.reflector = reflector
        if not self._stop.is_set():
            reflector.run()

    def _set_pods(self, pods: PodsByEndpoint) -> None:
        self._pods = pods
        self.slice_versions += 1
        if self._changed is not None:
            self._changed.set()

    async def _follow_control_plane(self) -> None:
        async for table in self.control_plane.snapshots():
            self._table = table
            if self._changed is not None:
                self._changed.set()

    async def snapshots(self) -> AsyncIterator[RoutingTable]:
        loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._stop.clear()
        thread = threading.Thread(target=self._watch, args=(loop,), name="endpointslices", daemon=True)
        thread.start()
        follow = loop.create_task(self._follow_control_plane())
        last: tuple[str, PodsByEndpoint | None] | None = None
        try:
            while True:
                await self._changed.wait()
                self._changed.clear()
                table, pods = self._table, self._pods
                if table is None or (table.version, pods) == last:
                    continue
                last = (table.version, pods)
                yield table if pods is None else with_pods(table, pods, f"slices{self.slice_versions}")
        finally:
            follow.cancel()
            self._stop.set()
            if self.reflector is not None:
                self.reflector.stop()
