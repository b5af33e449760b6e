"""The events a pod posts: hang, restart and crash loop, as JSON to ``POST /api/v1/events/``.

Writers: the prober and the pod supervisor (through ``dataplane.runtime.events.EventReporter``),
the cluster agent, and the Kubernetes pod watcher (``dataplane.cluster.k8s_objects``, handed to
the control plane in process). Reader: the control plane's events API
(``controlplane.api.serializers.EventSerializer``, whose writable fields are ``FIELDS``), which
stores each as an on-call Event and accepts the control plane's own kinds besides these.

    {"kind": "hang", "severity": "critical", "pod": "ep-7-v2-3", "message": "3 probes failed",
     "endpoint": 7, "detail": {"failed_probes": 3}, "time": "2026-11-29T03:00:00Z",
     "version": 2, "tenant": "acme"}

Every event names what it is about: the pod, and the endpoint, endpoint version and tenant the
pod serves (from its deployment's labels: `endpoint`, `version`, `tenant`), so that on-call can
filter by them and a tenant sees its own pods' restarts and hangs. The control plane trusts the
endpoint over the tenant: a tenant that is not the endpoint's is refused, and an event that
names only a pod is attributed through the pod's registration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

KINDS = ("hang", "restart", "crash_loop")
SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class PodEvent:
    kind: str  # one of KINDS
    severity: str  # one of SEVERITIES
    pod: str  # pod name
    message: str  # one line for the on-call view
    endpoint: int | None = None  # control-plane endpoint id; None when the pod has none
    detail: dict[str, Any] = field(default_factory=dict)  # JSON object of the numbers behind it
    time: str = ""  # when it happened, ISO 8601 UTC ("...Z"); filled at report time when empty
    version: int | None = None  # the endpoint version the pod runs; None when not known
    tenant: str = ""  # the tenant the pod's endpoint belongs to (its name); "" when not known

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"event kind {self.kind!r} not in {KINDS}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"event severity {self.severity!r} not in {SEVERITIES}")

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "pod": self.pod,
            "message": self.message,
            "endpoint": self.endpoint,
            "detail": dict(self.detail),
            "time": self.time,
            "version": self.version,
            "tenant": self.tenant,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PodEvent:
        """Refuses what is wrong, naming the field and the value."""
        for name in ("pod", "message"):
            if not isinstance(data.get(name), str):
                raise ValueError(f"event {name}={data.get(name)!r} must be a string")
        endpoint = data.get("endpoint")
        if endpoint is not None and (isinstance(endpoint, bool) or not isinstance(endpoint, int)):
            raise ValueError(f"event endpoint={endpoint!r} must be an integer or null")
        detail = data.get("detail", {})
        if not isinstance(detail, dict):
            raise ValueError(f"event detail={detail!r} must be a JSON object")
        time = data.get("time", "")
        if not isinstance(time, str):
            raise ValueError(f"event time={time!r} must be an ISO 8601 string")
        version = data.get("version")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
            raise ValueError(f"event version={version!r} must be a positive integer or null")
        tenant = data.get("tenant") or ""
        if not isinstance(tenant, str):
            raise ValueError(f"event tenant={tenant!r} must be a string")
        kind, severity = data.get("kind", ""), data.get("severity", "")
        return cls(kind, severity, data["pod"], data["message"], endpoint, detail, time, version, tenant)


def attribution(labels: Mapping[str, str]) -> tuple[int | None, int | None, str]:
    """(endpoint, version, tenant) from a deployment's labels ({"endpoint": "7", "version": "2",
    "tenant": "acme"}, as controlplane.endpoints.deployments writes them); missing ones are None/""."""

    def number(name: str) -> int | None:
        value = labels.get(name, "")
        return int(value) if isinstance(value, str) and value.isdigit() and int(value) > 0 else None

    return number("endpoint"), number("version"), str(labels.get("tenant", "") or "")


# The keys of the body, in order: the events API's writable fields.
FIELDS = tuple(f.name for f in dataclasses.fields(PodEvent))
