"""The events a pod posts: hang, restart and crash loop, as JSON to ``POST /api/v1/events/``.

Writers: the prober and the pod supervisor (through ``dataplane.runtime.events.EventReporter``),
the cluster agent, and the Kubernetes pod watcher (``dataplane.cluster.k8s_objects``, handed to
the control plane in process). Reader: the control plane's events API
(``controlplane.api.serializers.EventSerializer``, whose writable fields are ``FIELDS``), which
stores each as an on-call Event and accepts the control plane's own kinds besides these.

    {"kind": "hang", "severity": "critical", "pod": "ep-7-a", "message": "3 probes failed",
     "endpoint": 7, "detail": {"failed_probes": 3}, "time": "2026-11-29T03:00:00Z"}
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
        kind, severity = data.get("kind", ""), data.get("severity", "")
        return cls(kind, severity, data["pod"], data["message"], endpoint, detail, time)


# The keys of the body, in order: the events API's writable fields.
FIELDS = tuple(f.name for f in dataclasses.fields(PodEvent))
