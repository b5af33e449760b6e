"""The cluster driver interface and the objects it speaks in. No I/O here.

A *deployment* is one endpoint's pods: how many replicas, the pod's engine and arguments, and
the target concurrency per replica (the vertical autoscaler's value, which routers enforce). A
driver applies deployments declaratively, like `kubectl apply --prune`: what is not declared
is removed, so a restarted cluster agent is healed by the next apply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dataplane.cluster import pod_args


class ClusterError(Exception):
    """The cluster refused or could not be reached; the message says which and why."""


@dataclass(frozen=True)
class Deployment:
    name: str  # unique in the cluster, a DNS label ("ep-42")
    replicas: int  # >= 0
    engine: str = "sim"  # "sim" or "vllm" (see dataplane.runtime.pod)
    args: tuple[str, ...] = ()  # further `python -m dataplane.runtime.pod` arguments
    target_concurrency: int = 1  # in-flight requests per replica the routers allow, >= 1
    labels: Mapping[str, str] = field(default_factory=dict)  # e.g. {"endpoint": "42"}
    # The pods' credential for posting their endpoint's events (controlplane.endpoints.pod_keys), in
    # their environment as MU_POD_EVENTS_KEY; "" for none. Out of repr (logs) and of to_json
    # unless asked for (the agent's GET /deployments never shows it).
    events_key: str = field(default="", repr=False)

    def to_json(self, with_secrets: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": self.name,
            "replicas": self.replicas,
            "engine": self.engine,
            "args": list(self.args),
            "target_concurrency": self.target_concurrency,
            "labels": dict(self.labels),
        }
        if with_secrets and self.events_key:
            body["events_key"] = self.events_key
        return body

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Deployment:
        """Refuses what is wrong, naming the field and the value (the secret excepted), and the
        engine and arguments a declared deployment may not choose (dataplane.cluster.pod_args)."""
        name = data.get("name")
        if not isinstance(name, str) or not name or len(name) > 63:
            raise ValueError(f"deployment name {name!r} must be a non-empty string of at most 63 characters")
        replicas = data.get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"deployment {name}: replicas={replicas!r} must be an integer >= 0")
        engine = data.get("engine", "sim")
        args = data.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"deployment {name}: args={args!r} must be a list of strings")
        try:
            pod_args.check(engine, args)
        except ValueError as exc:
            raise ValueError(f"deployment {name}: {exc}") from None
        target = data.get("target_concurrency", 1)
        if isinstance(target, bool) or not isinstance(target, int) or target < 1:
            raise ValueError(f"deployment {name}: target_concurrency={target!r} must be an integer >= 1")
        labels = data.get("labels", {})
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise ValueError(f"deployment {name}: labels={labels!r} must map names to strings")
        events_key = data.get("events_key", "")
        if not isinstance(events_key, str):
            raise ValueError(f"deployment {name}: events_key must be a string")
        return cls(name, replicas, engine, tuple(args), target, labels, events_key)


@dataclass(frozen=True)
class PodState:
    name: str
    deployment: str
    url: str  # base URL of the pod's OpenAI-compatible server
    ready: bool  # serving; False while starting and once terminating
    restarts: int = 0
    warm: bool = False  # started from a pre-started (warm) process
    ready_after_s: float | None = None  # from start to first ready, seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "deployment": self.deployment,
            "url": self.url,
            "ready": self.ready,
            "restarts": self.restarts,
            "warm": self.warm,
            "ready_after_s": self.ready_after_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PodState:
        return cls(
            str(data["name"]),
            str(data["deployment"]),
            str(data["url"]),
            bool(data["ready"]),
            int(data.get("restarts", 0)),
            bool(data.get("warm", False)),
            data.get("ready_after_s"),
        )


class ClusterDriver(Protocol):
    def apply(self, deployments: Sequence[Deployment]) -> None:
        """Make these the cluster's deployments: create, update, and remove the undeclared."""

    def scale(self, name: str, replicas: int) -> None:
        """Set one deployment's replicas now (scale from zero, an autoscaler decision)."""

    def set_target_concurrency(self, name: str, target: int) -> None:
        """Push a deployment's target concurrency per replica without restarting its pods."""

    def list_pods(self) -> list[PodState]:
        """Every pod of every deployment, with readiness."""
