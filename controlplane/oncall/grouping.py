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
from collections.abc import Sequence

# Order matters: the longer, more specific shapes first, so a UUID is not read as numbers.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bhttps?://[^\s\"'<>]+", re.I), "<url>"),
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
        return f"pod:{pod}"
    return "fleet"


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


_ADDRESS = re.compile(r"\b(?:https?://[^\s\"'<>]+|\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?)", re.I)


def redact_addresses(text: str) -> str:
    """The text with URLs and IP addresses replaced: what a tenant may read of a pod's report
    (the pods' addresses are the fleet's, not the tenant's)."""
    return _ADDRESS.sub("<internal address>", text)
