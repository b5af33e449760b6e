"""Routing-table snapshots: what endpoints exist, their pods, keys and limits.

One small interface, ``Discovery``: an async iterator of ``RoutingTable`` snapshots. The router
applies each snapshot as it arrives (in-flight requests keep the pod objects they hold, so a
reload drops nothing). Two sources today:

  StaticDiscovery        a fixed list of backends (benchmarks, single-node use); no API keys.
  ControlPlaneDiscovery  polls ``GET {control_plane}/api/v1/routing-table/`` with the operator's
                         bearer key and ``If-None-Match: <etag>``; 304 = unchanged; a control
                         plane that is down or answers garbage leaves the last good table in use.

On Kubernetes, ``endpointslices.EndpointSliceDiscovery`` wraps the control-plane source and
yields the same snapshots with each endpoint's pods taken from its EndpointSlices.

The contract (the control plane's side is in controlplane/api):
  {"version": "<etag>", "endpoints": [{"id", "tenant", "name", "model", "policy", "alpha", "beta",
   "gamma", "mu_per_replica_minute", "target_concurrency_per_replica", "scale_to_zero_enabled",
   "reservation": {"mu_per_minute", "best_effort_allowed"} | null,
   "pods": [{"name", "url", "ready"}]}], "api_keys": [{"hash": sha256 hex, "tenant"}]}
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dataplane.router.balancer import POLICY_NAMES
from dataplane.router.pricing import Coefficients

log = logging.getLogger("dataplane.router.discovery")

STATIC_TENANT = ""  # the tenant of static mode: no keys, every request belongs to it
STATIC_ENDPOINT = "*"  # the endpoint name of static mode: matches any model
STATIC_COEFFICIENTS = Coefficients(0.002, 0.02, 0.1)  # static mode prices like a 70B chat model


@dataclass(frozen=True)
class PodSpec:
    name: str  # pod name, stable identity across snapshots
    url: str  # http://host:port
    ready: bool  # serving (readiness probe passed)
    version: str = ""  # the endpoint version it runs (see EndpointSpec.traffic)


@dataclass(frozen=True)
class Reservation:
    mu_per_minute: float  # reserved rate, MU/min
    best_effort_allowed: bool  # traffic beyond it may run while the endpoint has headroom


@dataclass(frozen=True)
class EndpointSpec:
    id: int  # control-plane id
    tenant: str  # tenant slug
    name: str  # what a request's "model" field names
    model: str  # the model served
    policy: str  # balancing policy name
    coefficients: Coefficients  # MU price of a request
    mu_per_replica_minute: float  # capacity of one pod, MU/min
    target_concurrency: int  # in-flight requests per pod before queueing; 0 = unlimited
    scale_to_zero_enabled: bool  # hold requests and wake the endpoint when no pod is ready
    reservation: Reservation | None  # the tenant's reserved rate, or None (all best-effort)
    pods: tuple[PodSpec, ...]
    # Percent of requests per version during a rollout or canary, e.g. (("1", 90), ("2", 10)); a
    # version at 0 takes no new request. Empty: one version, every pod.
    traffic: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class RoutingTable:
    version: str  # the ETag
    endpoints: tuple[EndpointSpec, ...]
    api_keys: dict[str, str]  # sha256 hex of a bearer secret -> tenant
    auth_required: bool = True  # False in static mode


class Discovery(Protocol):
    def snapshots(self) -> AsyncIterator[RoutingTable]: ...


def _num(d: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
        raise ValueError(f"{where}.{key} must be a number >= 0, got {v!r}")
    return float(v)


def parse_routing_table(doc: Any) -> RoutingTable:
    """Validate and convert the control plane's JSON; ValueError names the bad field."""
    if not isinstance(doc, dict):
        raise ValueError("routing table must be a JSON object")
    version = doc.get("version")
    if not isinstance(version, str):
        raise ValueError("routing table .version must be a string")
    eps_doc = doc.get("endpoints")
    keys_doc = doc.get("api_keys")
    if not isinstance(eps_doc, list) or not isinstance(keys_doc, list):
        raise ValueError("routing table .endpoints and .api_keys must be lists")
    endpoints = []
    for i, e in enumerate(eps_doc):
        where = f"endpoints[{i}]"
        if not isinstance(e, dict):
            raise ValueError(f"{where} must be an object")
        for key in ("tenant", "name"):
            if not isinstance(e.get(key), str):
                raise ValueError(f"{where}.{key} must be a string")
        if not isinstance(e.get("id"), int):
            raise ValueError(f"{where}.id must be an integer")
        policy = e.get("policy") or "p2c-mu"
        if policy not in POLICY_NAMES:
            raise ValueError(f"{where}.policy {policy!r} is not one of {POLICY_NAMES}")
        res = e.get("reservation")
        reservation = None
        if res is not None:
            if not isinstance(res, dict):
                raise ValueError(f"{where}.reservation must be an object or null")
            reservation = Reservation(
                _num(res, "mu_per_minute", f"{where}.reservation"), bool(res.get("best_effort_allowed", True))
            )
        pods_doc = e.get("pods") or []
        if not isinstance(pods_doc, list):
            raise ValueError(f"{where}.pods must be a list")
        pods = []
        for j, p in enumerate(pods_doc):
            if not isinstance(p, dict) or not isinstance(p.get("url"), str):
                raise ValueError(f"{where}.pods[{j}].url must be a string")
            pods.append(
                PodSpec(
                    str(p.get("name") or p["url"]),
                    p["url"],
                    bool(p.get("ready", True)),
                    str(p.get("version", "")),
                )
            )
        traffic_doc = e.get("traffic") or {}
        if not isinstance(traffic_doc, dict):
            raise ValueError(f"{where}.traffic must be an object of version: percent")
        traffic = tuple((str(v), _num(traffic_doc, v, f"{where}.traffic")) for v in sorted(traffic_doc))
        endpoints.append(
            EndpointSpec(
                id=e["id"],
                tenant=e["tenant"],
                name=e["name"],
                model=str(e.get("model") or e["name"]),
                policy=policy,
                coefficients=Coefficients(
                    _num(e, "alpha", where, 0.0), _num(e, "beta", where, 0.0), _num(e, "gamma", where, 0.0)
                ),
                mu_per_replica_minute=_num(e, "mu_per_replica_minute", where, 100.0),
                target_concurrency=int(_num(e, "target_concurrency_per_replica", where, 0)),
                scale_to_zero_enabled=bool(e.get("scale_to_zero_enabled", False)),
                reservation=reservation,
                pods=tuple(pods),
                traffic=traffic,
            )
        )
    api_keys = {}
    for k in keys_doc:
        if not (isinstance(k, dict) and isinstance(k.get("hash"), str) and isinstance(k.get("tenant"), str)):
            raise ValueError('api_keys entries must be {"hash": str, "tenant": str}')
        api_keys[k["hash"].lower()] = k["tenant"]
    return RoutingTable(version, tuple(endpoints), api_keys)


def static_table(
    backends: Sequence[str],
    policy: str,
    target_concurrency: int,
    rate_limit_mu_per_min: float | None = None,
    coefficients: Coefficients = STATIC_COEFFICIENTS,
) -> RoutingTable:
    """One endpoint that takes any model name; pods named by their URLs."""
    reservation = (
        Reservation(rate_limit_mu_per_min, best_effort_allowed=False) if rate_limit_mu_per_min else None
    )
    ep = EndpointSpec(
        id=0,
        tenant=STATIC_TENANT,
        name=STATIC_ENDPOINT,
        model=STATIC_ENDPOINT,
        policy=policy,
        coefficients=coefficients,
        mu_per_replica_minute=0.0,  # unknown capacity: best effort never sheds
        target_concurrency=target_concurrency,
        scale_to_zero_enabled=False,
        reservation=reservation,
        pods=tuple(PodSpec(url, url, True) for url in backends),
    )
    return RoutingTable("static", (ep,), {}, auth_required=False)


class StaticDiscovery:
    def __init__(self, table: RoutingTable) -> None:
        self.table = table

    async def snapshots(self) -> AsyncIterator[RoutingTable]:
        yield self.table


Fetch = Callable[..., Any]


class ControlPlaneDiscovery:
    """Poll the control plane; yield a table when it changes; keep the last good one otherwise."""

    def __init__(
        self,
        base_url: str,
        key: str,
        fetch: Fetch,
        poll_interval_s: float = 2.0,
        timeout_s: float = 5.0,
        max_polls: int | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/api/v1/routing-table/"
        self.key = key
        self.fetch = fetch  # upstream.fetch or a fake
        self.poll_interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self.max_polls = max_polls  # bound for tests; None = for the life of the router
        self.etag: str | None = None
        self.failures = 0  # polls in a row that got no usable answer, count
        self._rng = random.Random()

    async def poll_once(self) -> RoutingTable | None:
        """A new table, or None (unchanged, unreachable or garbage: keep the last good one)."""
        headers = {"authorization": f"Bearer {self.key}", "accept": "application/json"}
        if self.etag:
            headers["if-none-match"] = self.etag
        try:
            status, resp_headers, body = await self.fetch(self.url, "GET", headers, b"", self.timeout_s)
        except (OSError, ConnectionError, TimeoutError, ValueError) as exc:
            self.failures += 1
            log.warning("control plane unreachable (%s); keeping routing table %s", exc, self.etag)
            return None
        if status == 304:
            self.failures = 0
            return None
        if status != 200:
            self.failures += 1
            log.warning("control plane answered %s; keeping routing table %s", status, self.etag)
            return None
        try:
            table = parse_routing_table(json.loads(body))
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            self.failures += 1
            log.warning("bad routing table (%s); keeping %s", exc, self.etag)
            return None
        self.failures = 0
        self.etag = resp_headers.get("etag") or table.version
        return table

    async def snapshots(self) -> AsyncIterator[RoutingTable]:
        polls = 0
        while self.max_polls is None or polls < self.max_polls:
            polls += 1
            table = await self.poll_once()
            if table is not None:
                yield table
            # jitter 0.8-1.2x so that a fleet of routers does not poll in lockstep
            await asyncio.sleep(self.poll_interval_s * (0.8 + 0.4 * self._rng.random()))
