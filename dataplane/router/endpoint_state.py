"""One endpoint's live state in the router: its spec, pods, waiting requests and admitted MU rate.

``EndpointState.update`` installs a new spec from the routing table without dropping anything
live: pods keep their counters (matched by name), in-flight requests keep the ``PodLoad`` they
hold, and the requests waiting for a pod (``waiters_priority``, ``waiters``) are woken to look
again. How requests join and leave those queues is ``admission``'s business; this module only
holds them and wakes them (``wake_one`` when a pod frees up, ``wake_all`` on a reload).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from dataplane.router import balancer
from dataplane.router.config import RouterConfig
from dataplane.router.metering import RateWindow
from dataplane.router.ratelimit import GcraLimit
from dataplane.router.upstream import split_url
from dataplane.wire.routing_table import RoutedEndpoint


class EndpointState:
    """One endpoint's live state: spec (replaced on reload), pods, queue, policy, MU rate."""

    def __init__(self, spec: RoutedEndpoint, config: RouterConfig) -> None:
        self.spec = spec
        self.config = config
        self.created = int(time.time())  # unix s this router first served it: the model's `created`
        self.policy = balancer.make_policy(spec.policy)
        self.pods: list[balancer.PodLoad] = []
        self.addresses: dict[str, tuple[str, int, bytes, bytes]] = {}  # url -> host, port, host hdr, pod hdr
        self.inflight = 0  # requests of this endpoint at pods, count
        self.queued_mu = 0.0  # estimated MU of the requests waiting for a pod (or a wake), MU
        self.waiters_priority: deque[asyncio.Future[bool]] = deque()  # probes and reserved traffic
        self.waiters: deque[asyncio.Future[bool]] = deque()  # best effort
        self.rate = RateWindow(int(config.best_effort_window_s))  # MU admitted, for headroom
        self.changed = asyncio.Event()  # set on every reload that touches this endpoint
        self.wake_sent_at = -1e9  # monotonic s of the last wake call
        self.limit: GcraLimit | None = None  # the reservation as a GCRA limit, None without one
        self.limit_key = str(spec.id)
        self.split: list[tuple[float, list[balancer.PodLoad]]] = []  # (percent, pods) per version
        self.update(spec, {})

    def update(self, spec: RoutedEndpoint, old_pods: dict[str, balancer.PodLoad]) -> None:
        if spec.policy != self.spec.policy:
            self.policy = balancer.make_policy(spec.policy)
        self.spec = spec
        self.limit_key = str(spec.id)  # GCRA key: the reservation is per endpoint
        self.limit = (
            GcraLimit(spec.reservation.mu_per_minute, self.config.gcra_burst_s)
            if spec.reservation is not None and spec.reservation.mu_per_minute > 0
            else None
        )
        pods = []
        weights = dict(spec.traffic)
        groups: dict[str, list[balancer.PodLoad]] = {}
        for ps in spec.pods:
            pod = old_pods.get(ps.name) or balancer.PodLoad(ps.name, ps.url)
            pod.url = ps.url
            # A version at 0 % (a rollout's old pods draining, a new version still starting)
            # takes no new request; its in-flight requests hold their PodLoad and finish.
            share = weights.get(ps.version, 100.0 if not weights else 0.0)
            pod.ready = ps.ready and share > 0
            pod.target_concurrency = spec.target_concurrency
            pods.append(pod)
            groups.setdefault(ps.version, []).append(pod)
            if ps.url not in self.addresses:
                host, port = split_url(ps.url)
                self.addresses[ps.url] = (
                    host,
                    port,
                    f"{host}:{port}".encode(),
                    # escaped: a name the API took with a line feed must not end the header
                    b"x-pod: %s\r\n" % ps.name.encode("unicode_escape"),
                )
        self.pods = pods
        # Two versions both taking traffic (a canary): pick the version first, by its share.
        split = [(weights[v], group) for v, group in sorted(groups.items()) if weights.get(v, 0) > 0]
        self.split = split if len(split) > 1 else []
        self.changed.set()
        self.changed = asyncio.Event()
        self.wake_all()  # target concurrency may have grown: let waiters look again

    def capacity_mu_per_min(self) -> float:
        """Ready pods x MU/min per replica; 0 per replica means unknown, i.e. unlimited. An
        endpoint that scales to zero counts the replica a waiting request wakes, so its first
        best-effort request is held for the wake, not refused for want of headroom."""
        if self.spec.mu_per_replica_minute <= 0:
            return float("inf")
        ready = sum(1 for p in self.pods if p.available())
        if ready == 0 and self.spec.scale_to_zero_enabled:
            ready = 1
        return self.spec.mu_per_replica_minute * ready

    def queued(self) -> int:
        return len(self.waiters_priority) + len(self.waiters)

    def wake_one(self) -> None:
        self._wake(1)

    def wake_all(self) -> None:
        self._wake(self.queued())

    def _wake(self, n: int) -> None:
        """Let the first n live waiters (priority class first) look for a pod again."""
        for q in (self.waiters_priority, self.waiters):
            while q and n > 0:
                fut = q.popleft()
                if not fut.done():
                    fut.set_result(True)
                    n -= 1
