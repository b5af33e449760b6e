"""Pick a pod for a request: pure balancing logic, no I/O, time passed in.

``PodLoad`` is the router's live view of one pod (in-flight requests and MU, target concurrency,
health). A policy picks among the candidates that are ready, not ejected and under their target
concurrency; ``None`` means every pod is at its limit and the caller queues the request.

Policies (selectable per endpoint):
  round-robin    next pod in turn.
  random         uniform.
  least-request  fewest in-flight requests (ties broken at random).
  p2c            two pods at random, the one with fewer in-flight requests.
  p2c-mu         two pods at random, the one with less in-flight MU (ties: fewer requests). The
                 default: a pod with 3 long generations in flight (3 x 20 MU = 60) is busier than
                 one with 10 short ones (10 x 1 MU = 10), which request counts cannot see. The
                 MU of requests the pod has not begun to answer counts twice (`load_mu`): the
                 engine spends every step's token budget on prompts before it admits a new one,
                 so a pod prefilling a 126k-token prompt (5 s on an H100) holds a new request's
                 first token that long, where one decoding the same request does not.
                 MU cannot see free batch slots, though: on engines with few slots set the pod's
                 target concurrency to them (the routing table does), or p2c-mu may pick a pod
                 whose slots are all taken by cheap requests (bench/balancing_http.py shows both).

Health: a pod that fails ``eject_after_failures`` times in a row (connect refused, reset before
any byte) is ejected; it is probed after ``eject_backoff_s``, doubling per failed probe up to
``eject_backoff_max_s``; a successful probe re-admits it. Worked numbers (3 failures, 1 s, 30 s):
failures at t=10.0, 10.1, 10.2 -> ejected, probe due at 11.2; probe fails -> next at 13.2 (2 s),
then 17.2 (4 s) ...; a probe succeeds -> back in rotation with a clean slate.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence


class PodLoad:
    """Live load and health of one pod; mutated only by the event loop that owns it."""

    __slots__ = (
        "consecutive_failures",
        "ejected",
        "ejections",
        "inflight_mu",
        "inflight_requests",
        "name",
        "probe_due_at",
        "ready",
        "target_concurrency",
        "unanswered_mu",
        "url",
    )

    def __init__(self, name: str, url: str, target_concurrency: int = 0, ready: bool = True) -> None:
        self.name = name  # pod name, stable across routing-table versions
        self.url = url  # base URL, http://host:port
        self.target_concurrency = target_concurrency  # in-flight request limit; 0 = unlimited
        self.ready = ready  # the control plane says it serves
        self.inflight_requests = 0  # requests sent and not yet finished, count
        self.inflight_mu = 0.0  # estimated MU of those requests, MU
        self.unanswered_mu = 0.0  # MU of those the pod has sent no byte of an answer for yet
        self.consecutive_failures = 0  # connection failures since the last success, count
        self.ejected = False  # out of rotation until a probe succeeds
        self.ejections = 0  # failed probes since ejection + 1, drives the backoff doubling
        self.probe_due_at = 0.0  # when to probe an ejected pod, monotonic s

    def has_room(self) -> bool:
        """Under its target concurrency: 7 in flight of 8 -> True, 8 of 8 -> False."""
        return self.target_concurrency <= 0 or self.inflight_requests < self.target_concurrency

    def available(self) -> bool:
        return self.ready and not self.ejected

    def load_mu(self) -> float:
        """What p2c-mu weighs: in-flight MU, with the requests not answered yet counted again
        (their prompts are ahead of a new request's first token). 60 MU in flight of which 50
        not answered: 110; 90 MU all streaming their answers: 90, the lighter for a new request."""
        return self.inflight_mu + self.unanswered_mu

    def acquire(self, cost_mu: float) -> None:
        self.inflight_requests += 1
        self.inflight_mu += cost_mu
        self.unanswered_mu += cost_mu

    def answering(self, cost_mu: float) -> None:
        """The pod sent a request's first byte of answer: a stream's first token (vLLM opens an
        event stream's body with its first output), or a whole JSON answer."""
        self.unanswered_mu = max(0.0, self.unanswered_mu - cost_mu)

    def release(self, cost_mu: float, answered: bool = True) -> None:
        """A request ended; `answered`: `answering` was called for it."""
        self.inflight_requests -= 1
        self.inflight_mu -= cost_mu
        if not answered:
            self.answering(cost_mu)
        if self.inflight_requests == 0:
            self.inflight_mu = self.unanswered_mu = 0.0  # float dust: 0.1 + 0.2 - 0.1 - 0.2 != 0

    def __repr__(self) -> str:
        return (
            f"PodLoad({self.name!r}, req={self.inflight_requests}, mu={self.inflight_mu:.2f}, "
            f"unanswered={self.unanswered_mu:.2f}, "
            f"tc={self.target_concurrency}, ejected={self.ejected})"
        )


# --- health state machine -----------------------------------------------------------------


def record_success(pod: PodLoad) -> None:
    pod.consecutive_failures = 0


def record_failure(pod: PodLoad, now: float, eject_after: int, backoff_s: float) -> bool:
    """Count a failure; eject at ``eject_after`` in a row. True when this call ejected the pod."""
    pod.consecutive_failures += 1
    if not pod.ejected and pod.consecutive_failures >= eject_after:
        pod.ejected = True
        pod.ejections = 1
        pod.probe_due_at = now + backoff_s
        return True
    return False


def probe_result(pod: PodLoad, ok: bool, now: float, backoff_s: float, backoff_max_s: float) -> None:
    """After a probe of an ejected pod: re-admit, or back off twice as long (1, 2, 4 ... <= max)."""
    if ok:
        pod.ejected = False
        pod.ejections = 0
        pod.consecutive_failures = 0
        return
    pod.ejections += 1
    pod.probe_due_at = now + min(backoff_max_s, backoff_s * 2 ** (pod.ejections - 1))


# --- policies -----------------------------------------------------------------------------


def candidates(pods: Sequence[PodLoad], exclude: Sequence[PodLoad] = ()) -> list[PodLoad]:
    """Pods a request may go to now: ready, not ejected, under target concurrency, not tried."""
    return [p for p in pods if p.ready and not p.ejected and p.has_room() and p not in exclude]


Policy = Callable[[Sequence[PodLoad], random.Random], PodLoad]


class RoundRobin:
    """Next in turn over the candidates (the counter is per endpoint)."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self, pods: Sequence[PodLoad], rng: random.Random) -> PodLoad:
        pod = pods[self._next % len(pods)]
        self._next += 1
        return pod


def pick_weighted(groups: Sequence[tuple[float, list[PodLoad]]], rng: random.Random) -> list[PodLoad]:
    """One group, with probability proportional to its weight: (90, a), (10, b) -> a 9 times in 10."""
    point = rng.random() * sum(w for w, _ in groups)
    for weight, pods in groups:
        point -= weight
        if point < 0:
            return pods
    return groups[-1][1]


def pick_random(pods: Sequence[PodLoad], rng: random.Random) -> PodLoad:
    return pods[rng.randrange(len(pods))]


def pick_least_request(pods: Sequence[PodLoad], rng: random.Random) -> PodLoad:
    """Fewest in-flight requests; start the scan at a random pod so ties spread out."""
    n = len(pods)
    start = rng.randrange(n)
    best = pods[start]
    for i in range(1, n):
        p = pods[(start + i) % n]
        if p.inflight_requests < best.inflight_requests:
            best = p
    return best


def _two(pods: Sequence[PodLoad], rng: random.Random) -> tuple[PodLoad, PodLoad]:
    n = len(pods)
    i = rng.randrange(n)
    j = rng.randrange(n - 1)
    if j >= i:
        j += 1  # j is uniform over the other n-1 pods
    return pods[i], pods[j]


def pick_p2c(pods: Sequence[PodLoad], rng: random.Random) -> PodLoad:
    if len(pods) == 1:
        return pods[0]
    a, b = _two(pods, rng)
    return a if a.inflight_requests <= b.inflight_requests else b


def pick_p2c_mu(pods: Sequence[PodLoad], rng: random.Random) -> PodLoad:
    """Of two random pods, the lower `load_mu`: (60 MU, 3 req) vs (10 MU, 10 req), all answering,
    -> the second; 60 MU of which 50 not answered yet (110) vs 90 answering -> the second."""
    if len(pods) == 1:
        return pods[0]
    a, b = _two(pods, rng)
    load_a, load_b = a.load_mu(), b.load_mu()
    if load_a != load_b:
        return a if load_a < load_b else b
    return a if a.inflight_requests <= b.inflight_requests else b


POLICY_NAMES = ("round-robin", "random", "least-request", "p2c", "p2c-mu")
DEFAULT_POLICY = "p2c-mu"


def make_policy(name: str) -> Policy:
    """A fresh policy object (round-robin keeps a counter, so one per endpoint)."""
    if name == "round-robin":
        return RoundRobin()
    table: dict[str, Policy] = {
        "random": pick_random,
        "least-request": pick_least_request,
        "p2c": pick_p2c,
        "p2c-mu": pick_p2c_mu,
    }
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown balancing policy {name!r}; one of {', '.join(POLICY_NAMES)}") from None
