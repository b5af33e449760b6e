"""How repeats of one problem fold into one group, and how a group's history is drawn. Pure.

A problem is (kind, subject, pattern): the subject is the endpoint when the event has one, else
the pod, else the fleet; the pattern is the message with what changes between repeats replaced
(``normalise``): UUIDs, hex ids, addresses and numbers. So "pod ep-7-v2-13 restarted (restart
#4): Error, exit code 137" and "... ep-7-v2-14 ... #5 ..." are one problem on endpoint 7, and a
warning that names a different cause is another.

``sparkline`` turns per-bucket counts into the points of an SVG polyline, so the console draws a
group's history with no script and no inline style (the Content-Security-Policy allows neither).
"""

import hashlib
import re
from collections.abc import Callable, Sequence

_H = r"[0-9a-f]{1,4}"
_V4 = r"\d{1,3}(?:\.\d{1,3}){3}"
# IPv6 in full (eight groups) or compressed ("fd00:10:244::17", "::1", "::ffff:10.0.0.1"); never
# a time ("16:07:30": no "::", three groups). Bracketed with a port: "[fd00::17]:8000".
_V6 = rf"(?:(?:{_H}:){{7}}{_H}|(?:{_H}(?::{_H})*)?::(?:(?:{_H}:)*(?:{_V4}|{_H}))?)"
# Cluster host names: services and pods (*.svc, *.svc.cluster.local, *.cluster.local), cloud
# internal names (*.internal), and the pod-IP names ("ip-10-0-1-17", "10-244-1-17").
_LABEL = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
_HOST = rf"(?:{_LABEL}\.)+(?:svc(?:\.cluster\.local)?|cluster\.local|internal)(?![\w-])(?::\d+)?"
_POD_IP_NAME = r"(?:ip-)?\d{1,3}(?:-\d{1,3}){3}(?![\w-])"
# The fleet's addresses beyond URLs and IPv4: normalised away and redacted for tenants alike.
_FLEET_ADDRESS = (
    rf"\[{_V6}\](?::\d+)?|(?<![\w:.])(?P<v6>{_V6})(?![\w:])|(?<![\w.-])(?:{_HOST}|{_POD_IP_NAME})"
)
_URL = r"\bhttps?://[^\s\"'<>]+"
_ADDRESS = re.compile(rf"{_URL}|{_FLEET_ADDRESS}|\b{_V4}(?::\d+)?\b", re.I)
_FLEET_ADDRESS_RE = re.compile(_FLEET_ADDRESS, re.I)


def _replaced(token: str) -> Callable[[re.Match[str]], str]:
    def replace(match: re.Match[str]) -> str:
        # A bare "::", or hex words around one ("dead::beef"), are not addresses: an IPv6 has a digit.
        v6 = match.group("v6")
        return match.group() if v6 is not None and not any(c.isdigit() for c in v6) else token

    return replace


# Order matters: the longer, more specific shapes first, so a UUID is not read as numbers.
_PATTERNS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (re.compile(_URL, re.I), "<url>"),
    (_FLEET_ADDRESS_RE, _replaced("<addr>")),  # IPv6 and host names, before their numbers are
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<uuid>"),
    (re.compile(r"\b0x[0-9a-f]+\b", re.I), "<hex>"),
    # A hex id: 6+ hex digits with at least one digit and one letter ("7d9f0c", "a3f9e1b2").
    (re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{6,}\b", re.I), "<hex>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"), "<addr>"),
    (re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?"), "<n>"),
)
PATTERN_MAX = 500  # characters of a pattern kept (and hashed): a huge message is still one problem


def normalise(message: str) -> str:
    """The message with ids, addresses and numbers replaced, whitespace collapsed.

    >>> normalise("probe unanswered for 21.5 s (deadline 20 s), pod ep-7-v1-3")
    'probe unanswered for <n> s (deadline <n> s), pod ep-<n>-v<n>-<n>'
    """
    text = message
    for pattern, token in _PATTERNS:
        text = pattern.sub(token, text)
    return " ".join(text.split())[:PATTERN_MAX]


def subject(endpoint_id: int | None, endpoint_name: str, pod: str) -> str:
    """What a problem is about: its endpoint (by id, or by name once deleted), else its pod."""
    if endpoint_id is not None:
        return f"endpoint:{endpoint_id}"
    if endpoint_name:
        return f"endpoint-name:{endpoint_name}"
    if pod:
        return f"pod:{workload(pod)}"
    return "fleet"


# Kubernetes' suffix alphabet (no vowels, no 0/1/3): a replica set's hash and a pod's suffix.
_K8S = "bcdfghjklmnpqrstvwxz2456789"
_POD_SUFFIX = re.compile(rf"[{_K8S}]{{5}}")
_REPLICA_SET_HASH = re.compile(rf"[{_K8S}]{{6,10}}")


# The local agent's pods (dataplane.cluster.agent.pod_name): a deployment ("ep-7-v1"), the replica
# slot ("-r0"; none in names from before slots) and a serial.
_AGENT_POD = re.compile(r"(ep-\d+-v\d+)(-r\d+)?-\d+")


def _of_replica_set(parts: list[str]) -> bool:
    """A replica set's pod: its name ends in the set's hash and the pod's suffix."""
    return (
        len(parts) >= 3
        and bool(_POD_SUFFIX.fullmatch(parts[-1]))
        and bool(_REPLICA_SET_HASH.fullmatch(parts[-2]))
    )


def workload(pod: str) -> str:
    """The pod's name without what differs between a workload's pods: an ordinal ("ep-7-v1-13",
    a stateful set's "db-2"), a replica set's hash and pod suffix ("chat-7d9f5c8b6-x2k4q"), or a
    lone generated suffix with a digit ("node-agent-x2k4q"). So one crash across pods is one problem.

    >>> [workload(p) for p in ("ep-7-v1-13", "chat-7d9f5c8b6-x2k4q", "agent-x2k4q", "chat-proxy")]
    ['ep-7-v1', 'chat', 'agent', 'chat-proxy']
    >>> workload("ep-7-v1-r0-13")
    'ep-7-v1'
    """
    if match := _AGENT_POD.fullmatch(pod):
        return match[1]
    parts = pod.split("-")
    if _of_replica_set(parts):
        return "-".join(parts[:-2])
    if len(parts) >= 2 and (
        parts[-1].isdigit() or (_POD_SUFFIX.fullmatch(parts[-1]) and any(c.isdigit() for c in parts[-1]))
    ):
        return "-".join(parts[:-1])
    return pod


def replica_slot(pod: str) -> str:
    """Where a pod runs in its workload, kept by the pod started in its place: the local agent's
    slot ("ep-7-v1-r0-13" -> "ep-7-v1-r0"). A pod whose name carries no slot counts in its
    deployment: the agent's from before slots ("ep-7-v1-13" -> "ep-7-v1") and a Kubernetes
    Deployment's, named by a hash and a random suffix ("chat-7d9f5c8b6-x2k4q" -> "chat"). Any
    other pod (a stateful set's "db-2", the embedded stack's "stack-celery") is its own slot.

    >>> [replica_slot(p) for p in ("ep-7-v1-r0-13", "ep-7-v1-13", "chat-7d9f5c8b6-x2k4q", "db-2")]
    ['ep-7-v1-r0', 'ep-7-v1', 'chat', 'db-2']
    """
    if match := _AGENT_POD.fullmatch(pod):
        return match[1] + (match[2] or "")
    parts = pod.split("-")
    return "-".join(parts[:-2]) if _of_replica_set(parts) else pod


def fingerprint(kind: str, tenant_id: int | None, subject_: str, pattern: str) -> str:
    """The key of a group: equal for repeats of one problem, 64 hex characters."""
    key = "\x1f".join((kind, str(tenant_id or ""), subject_, pattern))
    return hashlib.sha256(key.encode()).hexdigest()


SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


def worse(a: str, b: str) -> str:
    """The more severe of two severities."""
    return a if SEVERITY_RANK.get(a, 0) >= SEVERITY_RANK.get(b, 0) else b


def sparkline(counts: Sequence[int], width: float = 96.0, height: float = 18.0) -> str:
    """The `points` of an SVG polyline for per-bucket counts, oldest first, scaled to the box;
    a bucket's count is drawn at the bucket's centre, the tallest at the top (y=1), none at the
    bottom (y=height-1). Worked example: counts (0, 2, 1) in 96 x 18 -> "16,17 48,1 80,9"."""
    if not counts:
        return ""
    top = max(max(counts), 1)
    step = width / len(counts)
    span = height - 2
    return " ".join(f"{(i + 0.5) * step:g},{height - 1 - span * n / top:g}" for i, n in enumerate(counts))


def redact_addresses(text: str) -> str:
    """The text with URLs, IP addresses and cluster host names replaced: what a tenant may read
    of a pod's report (the pods' addresses are the fleet's, not the tenant's)."""
    return _ADDRESS.sub(_replaced("<internal address>"), text)
