"""Sticky subsets: one workload's requests go to a small, stable subset of pods (pure).

A workload is an API key, a session (``x-session-id``) or an OpenAI ``user``. Rendezvous
(highest-random-weight) hashing ranks every pod by hash(workload, pod name) and keeps the top k:
the same workload lands on the same k pods, so their prefix caches hit; a pod joining or leaving
moves only the workloads that ranked it in their top k (about k/n of them), and one workload can
overload at most k pods (blast radius). k=2 keeps a spare for the power of two choices.

Load guard: a sticky subset must not become a hot spot. The subset is left (the request is
balanced over the whole fleet) when its least loaded pod carries more in-flight MU than
(1 + hot_ratio) x the fleet mean + hot_abs_mu. Worked numbers (ratio 0.5, abs 10 MU): fleet mean
20 MU, subset best 40 MU > 1.5 x 20 + 10 = 40? no, stay; at 41 MU -> leave. When the whole
fleet is idle (mean 0), a subset at 9 MU stays (9 < 10): the absolute margin keeps noise from
breaking stickiness.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Sequence
from typing import Any

from dataplane.router.balancer import PodLoad, Policy


def workload_of(headers: dict[bytes, bytes], body: dict[str, Any]) -> str | None:
    """A request's workload: its ``x-session-id``, else its ``user``, else its API key (None
    when it has none of them, as in static mode without keys)."""
    session = headers.get(b"x-session-id")
    if session:
        return session.decode("latin-1")
    user = body.get("user")
    if isinstance(user, str) and user:
        return user
    return headers.get(b"authorization", b"")[7:].decode("latin-1") or None


def rendezvous_score(workload: str, pod_name: str) -> int:
    """A 64-bit weight, uniform and stable across processes (unlike Python's salted hash())."""
    digest = hashlib.blake2b(f"{workload}\x00{pod_name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_subset(workload: str, pods: Sequence[PodLoad], k: int) -> list[PodLoad]:
    """The k pods with the highest score for this workload (all of them when k >= n)."""
    if k <= 0 or k >= len(pods):
        return list(pods)
    return heapq.nlargest(k, pods, key=lambda p: rendezvous_score(workload, p.name))


def subset_is_hot(
    subset: Sequence[PodLoad], fleet: Sequence[PodLoad], hot_ratio: float, hot_abs_mu: float
) -> bool:
    """True when the subset's best pod runs hotter than the fleet mean by the margin."""
    if not subset or not fleet:
        return False
    best = min(p.inflight_mu for p in subset)
    mean = sum(p.inflight_mu for p in fleet) / len(fleet)
    return best > (1.0 + hot_ratio) * mean + hot_abs_mu


def pick_sticky(
    policy: Policy,
    pods: Sequence[PodLoad],
    cands: Sequence[PodLoad],
    workload: str | None,
    k: int,
    hot_ratio: float,
    hot_abs_mu: float,
    rng: random.Random,
) -> PodLoad:
    """The pod for a request: the policy within the workload's subset while it has room and is
    not hot; otherwise the policy over the pods outside the subset (all candidates if none).

    ``pods`` are all pods of the endpoint (the subset is computed over the available ones so that
    it does not shift with load); ``cands`` are those that may take the request now (non-empty).
    """
    if not workload or k <= 0 or len(cands) <= k:
        return policy(cands, rng)
    avail = [p for p in pods if p.available()]
    subset = rendezvous_subset(workload, avail, k)
    inside = [p for p in subset if p in cands]
    if inside and not subset_is_hot(subset, avail, hot_ratio, hot_abs_mu):
        return policy(inside, rng)
    outside = [p for p in cands if p not in subset]
    return policy(outside or cands, rng)
