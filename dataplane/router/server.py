"""The router: routing state, the request handler, and the server's lifecycle.

Per request (``Router.handle``), in order, each step answering with an OpenAI-style error when
it fails: parse the JSON body (400) -> tenant from the bearer key (401) -> endpoint from
``model`` (404) -> price in MU -> admission: GCRA on the reservation, best effort on headroom
(429 + Retry-After) -> pick a pod (queue up to ``queue_wait_s`` when every pod is at its target
concurrency; 503 + Retry-After beyond) -> forward, retrying another pod when the connection
fails before any response byte -> meter.

Counters that must return to zero when the router is idle (tests assert them): every
``PodLoad.inflight_requests``, ``EndpointState.inflight`` and ``queued_mu``,
``ServerState.active_requests``, ``Pool.active`` and the queue lengths.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from dataplane.router import balancer
from dataplane.router.affinity import pick_sticky
from dataplane.router.config import RouterConfig
from dataplane.router.discovery import STATIC_ENDPOINT, Discovery
from dataplane.router.http import ClientConnection, Request, ServerState
from dataplane.router.metering import Meter, RateWindow, merge, prometheus_text, publish, snapshot
from dataplane.router.pricing import estimate_input_tokens, price, requested_output_tokens
from dataplane.router.proxy import Exchange, UpstreamFailed, build_request, parse_usage
from dataplane.router.ratelimit import (
    GcraLimit,
    InProcessLimiter,
    Limiter,
    TrafficClass,
    classify,
    has_headroom,
    retry_after_header,
)
from dataplane.router.upstream import Pool, fetch, split_url
from dataplane.wire.load_samples import RouterSecond, Sample
from dataplane.wire.routing_table import RoutedEndpoint, RoutingTable

log = logging.getLogger("dataplane.router")

COMPLETIONS = b"/v1/completions"
CHAT = b"/v1/chat/completions"
JSON_HEADERS = b"content-type: application/json\r\n"
# Answers that say the pod is broken count toward its ejection like a refused connection; a 503
# (overloaded, draining) or a 4xx is the pod working as it should.
POD_FAULTS = frozenset({500, 502, 504})


class EndpointState:
    """One endpoint's live state: spec (replaced on reload), pods, queue, policy, MU rate."""

    def __init__(self, spec: RoutedEndpoint, config: RouterConfig) -> None:
        self.spec = spec
        self.config = config
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
                    b"x-pod: %s\r\n" % ps.name.encode(),
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

    async def wait_for_room(self, priority: bool, timeout_s: float) -> bool:
        """Queue until a pod frees up. False: queue full, shed, or timed out (-> 503)."""
        if timeout_s <= 0:
            return False
        if self.queued() >= self.config.max_queued_requests:
            if priority and self.waiters:  # shed the newest best-effort waiter, never a reserved one
                victim = self.waiters.pop()
                if not victim.done():
                    victim.set_result(False)
            else:
                return False
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        q = self.waiters_priority if priority else self.waiters
        q.append(fut)
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return False
        finally:
            with contextlib.suppress(ValueError):
                q.remove(fut)


class RequestError(Exception):
    def __init__(self, status: int, message: str, code: str, headers: bytes = b"") -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers


class Router:
    def __init__(
        self,
        config: RouterConfig,
        limiter: Limiter | None = None,
        control_plane: str | None = None,
        key: str | None = None,
        redis: Any = None,
        seed: int | None = None,
        metrics_dir: str | None = None,
    ) -> None:
        self.config = config
        self.metrics_dir = metrics_dir  # shared by --workers N processes; None: one process
        self.clock = time.monotonic
        self.limiter: Limiter = limiter or InProcessLimiter(self.clock)
        self.control_plane = control_plane.rstrip("/") if control_plane else None
        self.key = key
        self.redis = redis
        self.rng = random.Random(seed)
        self.table: RoutingTable | None = None
        self.endpoints: dict[int, EndpointState] = {}
        self.by_tenant: dict[str, dict[str, EndpointState]] = {}
        self.pool = Pool(
            config.upstream_connect_timeout_s,
            config.upstream_idle_keepalive_s,
            config.max_idle_connections_per_pod,
        )
        self.meter = Meter(self.clock())
        self.state = ServerState(config, self.handle)
        self.table_loaded = asyncio.Event()
        self._probe_header = config.probe_header.lower().encode()
        self._probing: set[balancer.PodLoad] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._server: asyncio.AbstractServer | None = None
        self.fetch: Callable[..., Awaitable[tuple[int, dict[str, str], bytes]]] = fetch

    # --- routing table
    def apply(self, table: RoutingTable) -> None:
        """Install a snapshot. Pods keep their live counters (matched by endpoint id and pod
        name); in-flight requests hold their PodLoad, so removing a pod drops no request."""
        endpoints: dict[int, EndpointState] = {}
        by_tenant: dict[str, dict[str, EndpointState]] = {}
        for spec in table.endpoints:
            ep = self.endpoints.get(spec.id)
            if ep is None:
                ep = EndpointState(spec, self.config)
            else:
                ep.update(spec, {p.name: p for p in ep.pods})
            endpoints[spec.id] = ep
            by_tenant.setdefault(spec.tenant, {})[spec.name] = ep
        for old_id, ep in self.endpoints.items():
            if old_id not in endpoints:
                ep.wake_all()
        self.endpoints, self.by_tenant, self.table = endpoints, by_tenant, table
        self.table_loaded.set()
        log.info("routing table %s: %d endpoints", table.version, len(endpoints))

    # --- request handling
    async def handle(self, client: ClientConnection, req: Request) -> None:
        path = req.path
        q = path.find(b"?")
        if q >= 0:
            path = path[:q]
        if path == COMPLETIONS or path == CHAT:
            if req.method != b"POST":
                client.send_error(405, "use POST", "method_not_allowed")
                return
            try:
                await self.proxy(client, req)
            except RequestError as e:
                client.send_error(e.status, e.message, e.code, e.headers)
        elif path == b"/v1/models" and req.method == b"GET":
            try:
                client.send_json(200, self.models(req))
            except RequestError as e:
                client.send_error(e.status, e.message, e.code, e.headers)
        elif path == b"/metrics" and req.method == b"GET":
            client.send_response(
                200, b"content-type: text/plain; version=0.0.4\r\n", self.metrics_text().encode()
            )
        elif path == b"/health" and req.method == b"GET":
            ready = self.table is not None and not self.state.draining
            client.send_json(200 if ready else 503, {"status": "ok" if ready else "unavailable"})
        else:
            client.send_error(
                404, f"no route for {req.method.decode()} {path.decode('latin-1')}", "not_found"
            )

    def tenant_of(self, req: Request) -> str:
        table = self.table
        if table is None:
            raise RequestError(
                503,
                "router has no routing table yet",
                "not_ready",
                b"retry-after: %d\r\n" % self.config.retry_after_s,
            )
        if not table.auth_required:
            return ""
        auth = req.headers.get(b"authorization", b"")
        if not auth[:7].lower() == b"bearer " or len(auth) <= 7:
            raise RequestError(401, "missing API key: send Authorization: Bearer <key>", "missing_api_key")
        tenant = table.api_keys.get(hashlib.sha256(auth[7:].strip()).hexdigest())
        if tenant is None:
            raise RequestError(401, "invalid or revoked API key", "invalid_api_key")
        return tenant

    def endpoint_for(self, tenant: str, model: str) -> EndpointState:
        eps = self.by_tenant.get(tenant, {})
        ep = eps.get(model) or eps.get(STATIC_ENDPOINT)
        if ep is None:
            raise RequestError(
                404, f"the model {model!r} does not exist or you do not have access to it", "model_not_found"
            )
        return ep

    def models(self, req: Request) -> dict[str, Any]:
        tenant = self.tenant_of(req)
        data = [
            {"id": name, "object": "model", "owned_by": tenant or "router", "root": ep.spec.model}
            for name, ep in sorted(self.by_tenant.get(tenant, {}).items())
        ]
        return {"object": "list", "data": data}

    def pick(
        self, ep: EndpointState, workload: str | None, exclude: list[balancer.PodLoad]
    ) -> balancer.PodLoad | None:
        pods = ep.pods
        if ep.split:  # a canary: this request's version by the traffic shares, else the other
            chosen = balancer.pick_weighted(ep.split, self.rng)
            pods = chosen if balancer.candidates(chosen, exclude) else ep.pods
        cands = balancer.candidates(pods, exclude)
        if not cands:
            return None
        cfg = self.config
        return pick_sticky(
            ep.policy,
            pods,
            cands,
            workload,
            cfg.sticky_subset_size,
            cfg.sticky_hot_ratio,
            cfg.sticky_hot_abs_mu,
            self.rng,
        )

    async def proxy(self, client: ClientConnection, req: Request) -> None:
        cfg = self.config
        tenant = self.tenant_of(req)
        try:
            body = json.loads(req.body)
        except (ValueError, UnicodeDecodeError):
            raise RequestError(400, "request body is not valid JSON", "invalid_json") from None
        if not isinstance(body, dict):
            raise RequestError(400, "request body must be a JSON object", "invalid_json")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise RequestError(400, "you must provide a model parameter", "missing_model")
        ep = self.endpoint_for(tenant, model)
        spec = ep.spec
        key = (spec.id, tenant)
        tokens_in = estimate_input_tokens(body)
        tokens_out = requested_output_tokens(body, cfg.default_max_tokens)
        cost = price(spec.coefficients, tokens_in, tokens_out)
        now = self.clock()

        probe_hdr = req.headers.get(self._probe_header)
        prio = body.get("priority")
        is_probe = (probe_hdr is not None and probe_hdr not in (b"0", b"false")) or (
            isinstance(prio, int) and prio <= cfg.probe_priority
        )
        cls = await self.admit(ep, key, cost, is_probe, now)
        priority = cls is not TrafficClass.BEST_EFFORT

        workload_b = req.headers.get(b"x-session-id")
        user = body.get("user")
        workload = (
            workload_b.decode("latin-1")
            if workload_b
            else user
            if isinstance(user, str) and user
            else (req.headers.get(b"authorization", b"")[7:].decode("latin-1") or None)
        )
        deadline = now + cfg.queue_wait_s
        tried: list[balancer.PodLoad] = []
        attempts = 0
        started = False
        t0 = now
        outcome = None
        try:
            while outcome is None:
                pod = self.pick(ep, workload, tried)
                if pod is None:
                    ep.queued_mu += cost  # the backlog the autoscaler drains (metered each second)
                    try:
                        if not any(p.available() for p in ep.pods if p not in tried):
                            if tried:  # every pod failed to connect
                                raise RequestError(502, "no pod could be reached", "upstream_unreachable")
                            await self.wait_for_pods(ep)
                            deadline = self.clock() + cfg.queue_wait_s
                            continue
                        if not await ep.wait_for_room(priority, deadline - self.clock()):
                            raise RequestError(
                                503,
                                f"all pods of {model!r} are at their concurrency limit",
                                "overloaded",
                                b"retry-after: %d\r\n" % cfg.retry_after_s,
                            )
                        continue
                    finally:
                        ep.queued_mu -= cost
                attempts += 1
                if not started:
                    self.meter.start(key, self.clock())
                    started = True
                outcome = await self.forward(client, req, ep, pod, cost, attempts < cfg.max_attempts)
                if outcome is None:  # connection failed before any byte: another pod
                    tried.append(pod)
        except BaseException as exc:
            end = self.clock()
            if started:
                self.meter.finish(key, end, end - t0, 0.0, 0, 0, True)
            elif isinstance(exc, RequestError):
                self.meter.reject(key, end, exc.status)
            raise
        status, usage, events = outcome
        # exact price when the pod reported usage; else the estimate (tokens out from SSE events)
        if usage is not None:
            exact = price(spec.coefficients, usage[0], usage[1])
            tin, tout = usage
        else:
            exact, tin, tout = cost, tokens_in, (events if events else 0)
        if ep.limit is not None and not is_probe and exact != cost:
            self.limiter.correct(ep.limit_key, exact - cost)
        end = self.clock()
        self.meter.finish(key, end, end - t0, exact, tin, tout, status >= 500)

    async def admit(
        self, ep: EndpointState, key: tuple[int, str], cost: float, is_probe: bool, now: float
    ) -> TrafficClass:
        """Probe, reserved (GCRA conforms) or best effort (headroom); else 429 + Retry-After."""
        res = ep.spec.reservation
        conforms = False
        retry_after = float(self.config.retry_after_s)
        if ep.limit is not None and not is_probe:  # no reservation: no GCRA, no Redis round trip
            d = await self.limiter.check(ep.limit_key, cost, ep.limit)
            conforms = d.allowed
            retry_after = max(retry_after, d.retry_after_s)
        best_effort_allowed = res is None or res.best_effort_allowed
        # the headroom window is only read when it decides (best effort candidates)
        headroom = (
            not is_probe
            and not conforms
            and best_effort_allowed
            and has_headroom(ep.rate.rate_per_min(now), cost, ep.capacity_mu_per_min())
        )
        cls = classify(is_probe, res is not None, conforms, best_effort_allowed, headroom)
        if cls is TrafficClass.REJECTED:
            self.meter.reject(key, now, 429)
            why = "reservation exhausted and " if res else ""
            raise RequestError(
                429,
                f"rate limit for {ep.spec.name!r} reached: {why}no headroom for best-effort traffic",
                "rate_limit_exceeded",
                b"retry-after: %s\r\n" % retry_after_header(retry_after).encode(),
            )
        ep.rate.add(now, cost)
        return cls

    async def forward(
        self,
        client: ClientConnection,
        req: Request,
        ep: EndpointState,
        pod: balancer.PodLoad,
        cost: float,
        may_retry: bool,
    ) -> tuple[int, tuple[int, int] | None, int] | None:
        """Send to ``pod``; (status, usage, SSE events) or None to retry elsewhere."""
        cfg = self.config
        host, port, host_hdr, pod_hdr = ep.addresses[pod.url]
        pod.acquire(cost)
        ep.inflight += 1
        conn = None
        reusable = False
        try:
            try:
                conn, reused = await self.pool.acquire(host, port)
            except (OSError, TimeoutError) as exc:
                self._failed(pod, f"connect: {exc!r}")
                if may_retry:
                    return None
                raise RequestError(
                    502, f"could not connect to a pod: {exc}", "upstream_unreachable"
                ) from None
            exch = Exchange(client, conn, pod_hdr, cfg.upstream_read_timeout_s)
            conn.send(build_request(req.method, req.path, host_hdr, req.headers, req.body), exch)
            try:
                await exch.head
            except UpstreamFailed as exc:
                if not reused:  # a stale pooled socket is not the pod's fault
                    self._failed(pod, str(exc))
                if may_retry:
                    return None
                raise RequestError(
                    502, "the pod closed the connection before answering", "upstream_failed"
                ) from None
            try:
                await exch.done
            except UpstreamFailed:
                client.abort()  # mid-stream: cut the client too, never splice another pod in
                return exch.status if exch.status >= 500 else 502, None, exch.events
            finally:
                exch.cancel_timer()
            if exch.status in POD_FAULTS:
                self._failed(pod, f"answered {exch.status}")
            else:
                balancer.record_success(pod)
            reusable = True
            return exch.status, parse_usage(exch.tail), exch.events
        finally:
            if conn is not None:
                if conn.sink is not None:  # cancelled mid-exchange: the pod must stop working
                    conn.sink = None
                    conn.close()
                self.pool.release(host, port, conn, reusable)
            pod.release(cost)
            ep.inflight -= 1
            ep.wake_one()

    def _failed(self, pod: balancer.PodLoad, reason: str) -> None:
        if balancer.record_failure(
            pod, self.clock(), self.config.eject_after_failures, self.config.eject_backoff_s
        ):
            log.warning("pod %s ejected after %d failures (%s)", pod.name, pod.consecutive_failures, reason)

    async def wait_for_pods(self, ep: EndpointState) -> None:
        """No pod available: wake a scale-to-zero endpoint and hold the request, else 503."""
        cfg = self.config
        retry = b"retry-after: %d\r\n" % cfg.retry_after_s
        if not ep.spec.scale_to_zero_enabled:
            raise RequestError(503, f"no ready pod for {ep.spec.name!r}", "no_ready_pod", retry)
        deadline = self.clock() + cfg.wake_deadline_s
        while not any(p.available() for p in ep.pods):
            now = self.clock()
            if now >= deadline:
                raise RequestError(
                    503, f"{ep.spec.name!r} is waking up from zero; try again", "scaling_from_zero", retry
                )
            if now - ep.wake_sent_at >= cfg.wake_retry_s:
                ep.wake_sent_at = now
                self._spawn(self.wake(ep.spec.id))
            changed = ep.changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(deadline - now, cfg.wake_retry_s))

    async def wake(self, endpoint_id: int) -> None:
        if not self.control_plane:
            return
        url = f"{self.control_plane}/api/v1/endpoints/{endpoint_id}/wake/"
        try:
            status, _, _ = await self.fetch(
                url, "POST", {"authorization": f"Bearer {self.key}"}, b"", self.config.control_plane_timeout_s
            )
            if status not in (200, 202, 204, 404):
                log.warning("wake %s answered %s", endpoint_id, status)
        except (OSError, TimeoutError, ConnectionError) as exc:
            log.warning("wake %s failed: %s", endpoint_id, exc)

    # --- background work
    def _spawn(self, coro: Awaitable[None]) -> None:
        async def run() -> None:
            await coro

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

    async def probe(self, pod: balancer.PodLoad) -> None:
        ok = False
        try:
            status, _, _ = await self.fetch(
                pod.url.rstrip("/") + "/health", "GET", None, b"", self.config.probe_timeout_s
            )
            ok = 200 <= status < 300
        except (OSError, TimeoutError, ConnectionError):
            ok = False
        finally:
            self._probing.discard(pod)
        balancer.probe_result(
            pod, ok, self.clock(), self.config.eject_backoff_s, self.config.eject_backoff_max_s
        )
        if ok:
            log.info("pod %s re-admitted after a successful probe", pod.name)
            for ep in self.endpoints.values():
                if pod in ep.pods:
                    ep.wake_all()

    def tick(self) -> list[Sample]:
        """Once a second: probe ejected pods that are due, sweep idle connections, roll metrics."""
        now = self.clock()
        for ep in self.endpoints.values():
            for pod in ep.pods:
                if pod.ejected and now >= pod.probe_due_at and pod not in self._probing:
                    self._probing.add(pod)
                    self._spawn(self.probe(pod))
        self.pool.sweep(now)
        queued = {
            ep.spec.id: (ep.queued(), ep.queued_mu) for ep in self.endpoints.values() if ep.queued_mu > 0
        }
        return self.meter.roll(now, queued)

    async def maintenance(self, interval_s: float = 1.0) -> None:
        """Every second: tick, then publish the second's rows (and that this router was up) to
        Redis, or, without Redis in control-plane mode, post them to the control plane."""
        while True:
            await asyncio.sleep(interval_s)
            rows = self.tick()
            self.write_snapshot()
            second = int(time.time()) - 1
            try:
                if self.redis is not None:
                    await publish(self.redis, rows, second, self.config.metrics_ttl_s)
                elif self.control_plane:
                    await self.post_samples(rows, second)
            except Exception as exc:  # a metrics sink down must not stop the router
                log.warning("metrics publish failed: %s", exc)

    async def post_samples(self, rows: list[Sample], second: int) -> None:
        body = json.dumps(RouterSecond(second, tuple(rows)).to_json()).encode()
        status, _, answer = await self.fetch(
            f"{self.control_plane}/api/v1/load-samples/",
            "POST",
            {"authorization": f"Bearer {self.key}", "content-type": "application/json"},
            body,
            self.config.control_plane_timeout_s,
        )
        if status != 201:
            log.warning("load samples answered %s: %s", status, answer[:200])

    async def follow(self, discovery: Discovery) -> None:
        async for table in discovery.snapshots():
            self.apply(table)

    def metrics_parts(self) -> tuple[dict[int, str], list[tuple[int, str, int, float, bool]]]:
        names = {ep.spec.id: ep.spec.name for ep in self.endpoints.values()}
        pods = [
            (ep.spec.id, p.name, p.inflight_requests, p.inflight_mu, p.ejected)
            for ep in self.endpoints.values()
            for p in ep.pods
        ]
        return names, pods

    def metrics_text(self) -> str:
        """This process's counters; with a metrics directory (several workers), all workers'."""
        names, pods = self.metrics_parts()
        if self.metrics_dir is None:
            return prometheus_text(self.meter.totals, names, pods)
        self.write_snapshot()  # this worker's freshest numbers
        snaps = []
        for path in Path(self.metrics_dir).glob("*.json"):
            with contextlib.suppress(OSError, ValueError):  # a worker that is gone, or mid-rename
                snaps.append(json.loads(path.read_text()))
        return prometheus_text(*merge(snaps))

    def write_snapshot(self) -> None:
        if self.metrics_dir is None:
            return
        names, pods = self.metrics_parts()
        path = Path(self.metrics_dir) / f"{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(snapshot(self.meter.totals, names, pods)))
        tmp.replace(path)  # atomic: a scrape never reads half a file

    # --- lifecycle
    async def start(
        self,
        host: str,
        port: int,
        discovery: Discovery,
        reuse_port: bool = False,
        sock: socket.socket | None = None,
    ) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(self.follow(discovery)))
        self._tasks.append(asyncio.get_running_loop().create_task(self.maintenance()))
        loop = asyncio.get_running_loop()
        if sock is not None:
            self._server = await loop.create_server(
                lambda: ClientConnection(self.state), sock=sock, backlog=self.config.backlog
            )
        else:
            self._server = await loop.create_server(
                lambda: ClientConnection(self.state),
                host,
                port,
                reuse_port=reuse_port or None,
                backlog=self.config.backlog,
            )

    @property
    def port(self) -> int:
        server = cast(asyncio.Server, self._server)
        return int(server.sockets[0].getsockname()[1])

    async def shutdown(self, drain_timeout_s: float | None = None) -> int:
        """Stop accepting, let in-flight requests finish for a bounded time, then cancel them.
        Returns the number of requests cut at the deadline."""
        timeout = self.config.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        st = self.state
        st.draining = True
        if self._server is not None:
            self._server.close()
        for c in list(st.connections):
            c.close_when_idle()
        deadline = self.clock() + timeout
        while st.active_requests and self.clock() < deadline:
            st.idle_event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(st.idle_event.wait(), deadline - self.clock())
        cut = st.active_requests
        for c in list(st.connections):
            c.abort()
        for ep in self.endpoints.values():
            ep.wake_all()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        # Bounded: on Python 3.11 asyncio.wait_for can swallow a cancel that lands as its inner
        # call completes (fixed in 3.12), so a task may need a second cancel; never wait forever.
        for _ in range(3):
            if not tasks:
                break
            _, pending = await asyncio.wait(tasks, timeout=0.5)
            tasks = list(pending)
            for t in tasks:
                t.cancel()
        await asyncio.sleep(0)  # let aborted connections run connection_lost
        self.pool.close_all()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
        return cut
