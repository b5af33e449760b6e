"""The routing table as the control plane serves it at ``GET /api/v1/routing-table/`` (every
endpoint with its pricing, limits, traffic split and pods, and each tenant's keys' epoch), and one
key's lookup, ``GET /api/v1/routing-table/keys/<sha256>/``.

Writer: ``controlplane.endpoints.routing`` (the version is the view's ETag). Readers: the routers
(``dataplane.router.discovery``), which keep the last good table when a new one is refused.
Missing optional keys read as their defaults, so older writers stay readable: a new field needs a
default. Keys are not in the table: a router looks a key it does not know up by its digest and
keeps the answer while its tenant's epoch holds. The JSON shape and each field's meaning:
docs/router.md, "The routing table".
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from capacity.units import DEFAULT_MAX_MODEL_LEN, MU_PER_REPLICA_MINUTE, CostModel
from dataplane.router.balancer import DEFAULT_POLICY, POLICY_NAMES

# The Redis channel on which the control plane announces the version of every table it builds,
# about once a second (controlplane.endpoints.routing.publish): a router subscribed to it
# (dataplane.router.control_plane.TablePush) polls at once when the version is not its own.
# Pub/sub spans a server's databases, so each database has its own (``channel``).
CHANNEL = "routing-table:version"


def channel(redis: Any) -> str:
    """The announcements' channel for the database a Redis client (sync or asyncio) uses: a
    control plane on db 3 and one on db 0 of one server do not hear each other's versions."""
    return f"{CHANNEL}:{redis.connection_pool.connection_kwargs.get('db', 0)}"


def _finite(d: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    v = d.get(key, default)
    # NaN passes every comparison (a NaN rate admits everything), inf breaks the lease's Lua
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{where}.{key} must be a finite number, got {v!r}")
    return float(v)


def _num(d: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    v = _finite(d, key, where, default)
    if v < 0:
        raise ValueError(f"{where}.{key} must be a finite number >= 0, got {v!r}")
    return v


def _coefficients(e: Mapping[str, Any], where: str) -> CostModel:
    """The price, each coefficient read as a finite number and the rest of its rule (gamma >=
    -beta, the others >= 0) left to CostModel, its one place."""
    try:
        return CostModel(
            _finite(e, "alpha", where, 0.0),
            _finite(e, "beta", where, 0.0),
            _finite(e, "gamma", where, 0.0),
            rho=_finite(e, "rho", where, 0.0),  # absent from an older control plane's table: 0
            kappa=_finite(e, "kappa", where, 0.0),
            delta=_finite(e, "delta", where, 0.0),
            # absent from an older table: capacity.units' default share
            cached_token_factor=_finite(e, "cached_token_factor", where, CostModel.cached_token_factor),
        )
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class RoutedPod:
    name: str  # pod name, stable identity across snapshots
    url: str  # http://host:port
    ready: bool  # serving (readiness probe passed)
    version: str = ""  # the endpoint version it runs (see RoutedEndpoint.traffic); "" when one

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "ready": self.ready, "version": self.version}

    @classmethod
    def from_json(cls, doc: Any, where: str = "pod") -> RoutedPod:
        if not isinstance(doc, dict) or not isinstance(doc.get("url"), str):
            raise ValueError(f"{where}.url must be a string")
        url = doc["url"]
        return cls(
            str(doc.get("name") or url), url, bool(doc.get("ready", True)), str(doc.get("version", ""))
        )


@dataclass(frozen=True)
class ReservedRate:
    mu_per_minute: float  # the tenant's reserved rate on the endpoint, MU/min >= 0
    best_effort_allowed: bool  # traffic beyond it may run while the endpoint has headroom

    def to_json(self) -> dict[str, Any]:
        return {"mu_per_minute": self.mu_per_minute, "best_effort_allowed": self.best_effort_allowed}

    @classmethod
    def from_json(cls, doc: Any, where: str = "reservation") -> ReservedRate:
        if not isinstance(doc, dict):
            raise ValueError(f"{where} must be an object or null")
        return cls(_num(doc, "mu_per_minute", where), bool(doc.get("best_effort_allowed", True)))


@dataclass(frozen=True)
class RoutedEndpoint:
    id: int  # control-plane id
    tenant: str  # tenant slug
    name: str  # what a request's "model" field names
    model: str  # the model served
    policy: str  # balancing policy, one of POLICY_NAMES
    coefficients: CostModel  # MU price of a request (alpha, beta, gamma on the wire)
    mu_per_replica_minute: float  # capacity of one pod, MU/min >= 0; 0 = unknown (unlimited)
    target_concurrency: int  # in-flight requests per pod before queueing, >= 0; 0 = unlimited
    scale_to_zero_enabled: bool  # hold requests and wake the endpoint when no pod is ready
    reservation: ReservedRate | None  # the tenant's reserved rate, or None (all best-effort)
    pods: tuple[RoutedPod, ...]
    # Percent of requests per version during a rollout or canary, e.g. (("1", 90), ("2", 10)); a
    # version at 0 takes no new request. Empty: one version, every pod.
    traffic: tuple[tuple[str, float], ...] = ()
    max_model_len: int = DEFAULT_MAX_MODEL_LEN  # context length (prompt + output), tokens >= 1
    max_token_bytes: int = 0  # most UTF-8 bytes in one token of the pods' tokenizer; 0 unknown
    served_model_name: str = ""  # the name its pods serve; "": the name requests ask for

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "name": self.name,
            "served_model_name": self.served_model_name,
            "model": self.model,
            "policy": self.policy,
            "alpha": self.coefficients.alpha,
            "beta": self.coefficients.beta,
            "gamma": self.coefficients.gamma,
            "rho": self.coefficients.rho,
            "kappa": self.coefficients.kappa,
            "delta": self.coefficients.delta,
            "cached_token_factor": self.coefficients.cached_token_factor,
            "mu_per_replica_minute": self.mu_per_replica_minute,
            "target_concurrency_per_replica": self.target_concurrency,
            "scale_to_zero_enabled": self.scale_to_zero_enabled,
            "max_model_len": self.max_model_len,
            "max_token_bytes": self.max_token_bytes,
            "reservation": self.reservation.to_json() if self.reservation is not None else None,
            "traffic": dict(self.traffic),
            "pods": [p.to_json() for p in self.pods],
        }

    @classmethod
    def from_json(cls, e: Any, where: str = "endpoint") -> RoutedEndpoint:
        if not isinstance(e, dict):
            raise ValueError(f"{where} must be an object")
        for key in ("tenant", "name"):
            if not isinstance(e.get(key), str):
                raise ValueError(f"{where}.{key} must be a string")
        served = e.get("served_model_name", "")  # an older writer's pods serve the name asked
        if not isinstance(served, str):
            raise ValueError(f"{where}.served_model_name must be a string, got {served!r}")
        if not isinstance(e.get("id"), int):
            raise ValueError(f"{where}.id must be an integer")
        policy = e.get("policy") or DEFAULT_POLICY
        if policy not in POLICY_NAMES:
            raise ValueError(f"{where}.policy {policy!r} is not one of {POLICY_NAMES}")
        res = e.get("reservation")
        reservation = None if res is None else ReservedRate.from_json(res, f"{where}.reservation")
        pods_doc = e.get("pods") or []
        if not isinstance(pods_doc, list):
            raise ValueError(f"{where}.pods must be a list")
        pods = tuple(RoutedPod.from_json(p, f"{where}.pods[{j}]") for j, p in enumerate(pods_doc))
        traffic_doc = e.get("traffic") or {}
        if not isinstance(traffic_doc, dict):
            raise ValueError(f"{where}.traffic must be an object of version: percent")
        traffic = tuple((str(v), _num(traffic_doc, v, f"{where}.traffic")) for v in traffic_doc)
        max_model_len = e.get("max_model_len", DEFAULT_MAX_MODEL_LEN)
        if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
            raise ValueError(f"{where}.max_model_len must be an integer >= 1, got {max_model_len!r}")
        max_token_bytes = e.get("max_token_bytes", 0)
        if isinstance(max_token_bytes, bool) or not isinstance(max_token_bytes, int) or max_token_bytes < 0:
            raise ValueError(f"{where}.max_token_bytes must be an integer >= 0, got {max_token_bytes!r}")
        return cls(
            id=e["id"],
            tenant=e["tenant"],
            name=e["name"],
            model=str(e.get("model") or e["name"]),
            policy=policy,
            coefficients=_coefficients(e, where),
            mu_per_replica_minute=_num(e, "mu_per_replica_minute", where, MU_PER_REPLICA_MINUTE),
            target_concurrency=int(_num(e, "target_concurrency_per_replica", where, 0)),
            scale_to_zero_enabled=bool(e.get("scale_to_zero_enabled", False)),
            reservation=reservation,
            pods=pods,
            traffic=traffic,
            max_model_len=max_model_len,
            max_token_bytes=max_token_bytes,
            served_model_name=served,
        )


def is_digest(text: str) -> bool:
    """Whether ``text`` is a key's digest as the wire carries it: 64 lower-case hex digits."""
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


@dataclass(frozen=True)
class KeyEpoch:
    """Where a tenant's keys stand: its id (a tenant made again under a deleted one's name has
    another) and how many of its keys were ever revoked. A key known under an older epoch of
    its tenant may have been revoked since."""

    tenant_id: int
    revoked: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.tenant_id, "revoked": self.revoked}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> KeyEpoch:
        if not isinstance(doc, dict):
            raise ValueError(f"{where} must be an object")
        for name in ("id", "revoked"):
            v = doc.get(name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{where}.{name} must be an integer >= 0, got {v!r}")
        return cls(doc["id"], doc["revoked"])


@dataclass(frozen=True)
class KeyLookup:
    """One key's lookup: its tenant and the tenant's epoch while it is an active tenant key,
    None for both when it is not (unknown, revoked, or an operator's)."""

    digest: str  # sha256 hex of the bearer secret
    tenant: str | None
    epoch: KeyEpoch | None

    def to_json(self) -> dict[str, Any]:
        return {
            "hash": self.digest,
            "tenant": self.tenant,
            "epoch": None if self.epoch is None else self.epoch.to_json(),
        }

    @classmethod
    def from_json(cls, doc: Any) -> KeyLookup:
        if not isinstance(doc, dict) or not isinstance(doc.get("hash"), str) or not is_digest(doc["hash"]):
            raise ValueError("key lookup .hash must be 64 lower-case hex digits")
        tenant, epoch = doc.get("tenant"), doc.get("epoch")
        if tenant is None and epoch is None:
            return cls(doc["hash"], None, None)
        if not isinstance(tenant, str):
            raise ValueError(f"key lookup .tenant must be a string or null, got {tenant!r}")
        return cls(doc["hash"], tenant, KeyEpoch.from_json(epoch, "key lookup .epoch"))


@dataclass(frozen=True)
class RoutingTable:
    version: str  # the ETag: changes whenever anything else in the table does
    endpoints: tuple[RoutedEndpoint, ...]
    # Keys known without a lookup, sha256 hex (lower case) of a bearer secret -> tenant: an older
    # control plane's every active key, or a test's; the control plane sends none
    api_keys: dict[str, str]
    auth_required: bool = True  # False in static mode (no keys); not on the wire
    key_epochs: Mapping[str, KeyEpoch] = field(default_factory=dict)  # tenant -> its keys' epoch

    @classmethod
    def versioned(
        cls,
        endpoints: tuple[RoutedEndpoint, ...],
        api_keys: dict[str, str],
        key_epochs: Mapping[str, KeyEpoch] | None = None,
    ) -> RoutingTable:
        """A table whose version is a hash of its content, so that a router's `If-None-Match`
        gets 304 until something a router reads changes, whatever changed it."""
        unversioned = cls("", endpoints, api_keys, key_epochs=dict(key_epochs or {}))
        content = json.dumps(unversioned._content(), sort_keys=True)
        return replace(unversioned, version=hashlib.sha256(content.encode()).hexdigest()[:32])

    def _content(self) -> dict[str, Any]:
        content: dict[str, Any] = {"endpoints": [e.to_json() for e in self.endpoints]}
        if self.api_keys:
            content["api_keys"] = [{"hash": h, "tenant": tenant} for h, tenant in self.api_keys.items()]
        content["key_epochs"] = {t: e.to_json() for t, e in self.key_epochs.items()}
        return content

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, **self._content()}

    @classmethod
    def from_json(cls, doc: Any) -> RoutingTable:
        """Validate and convert the control plane's JSON; ValueError names the bad field."""
        if not isinstance(doc, dict):
            raise ValueError("routing table must be a JSON object")
        version = doc.get("version")
        if not isinstance(version, str):
            raise ValueError("routing table .version must be a string")
        eps_doc = doc.get("endpoints")
        keys_doc = doc.get("api_keys", [])
        if not isinstance(eps_doc, list) or not isinstance(keys_doc, list):
            raise ValueError("routing table .endpoints and .api_keys must be lists")
        endpoints = tuple(RoutedEndpoint.from_json(e, f"endpoints[{i}]") for i, e in enumerate(eps_doc))
        api_keys: dict[str, str] = {}
        for k in keys_doc:
            if not (
                isinstance(k, dict) and isinstance(k.get("hash"), str) and isinstance(k.get("tenant"), str)
            ):
                raise ValueError('api_keys entries must be {"hash": str, "tenant": str}')
            api_keys[k["hash"].lower()] = k["tenant"]
        epochs_doc = doc.get("key_epochs", {})
        if not isinstance(epochs_doc, dict):
            raise ValueError("routing table .key_epochs must be an object of tenant: epoch")
        epochs = {str(t): KeyEpoch.from_json(e, f"key_epochs[{t!r}]") for t, e in epochs_doc.items()}
        return cls(version, endpoints, api_keys, key_epochs=epochs)
