"""The router: the request handler (the hot path), the routing table it serves, its lifecycle.

Per request (``Router.handle``), in order, each step answering with an OpenAI-style error when
it fails: tenant from the bearer key (401; ``keys``: looked up at the control plane when this
process has not seen it, 503 when it cannot be checked) -> parse the JSON body (400) -> endpoint from
``model`` (404) -> validate what it asks the engine to generate (``validation``, 400 naming the
parameter) -> price in MU -> its class: a probe only with the prober credential, a tenant's
``priority`` clamped -> the tenant's ``cache_salt`` set (``cache_salt``: a 400 for a client's
that vLLM refuses) -> admission (``admission``): GCRA on the reservation, best effort
on headroom (429 + Retry-After) -> pick a pod (queue up to ``queue_wait_s`` when every pod is at
its target concurrency; 503 + Retry-After beyond) -> forward, retrying another pod when the
connection fails before any response byte -> meter.

The router's own paths (``Router.answer``): ``/v1/models``, ``/health`` and the operator
endpoints (``/metrics``) answer GET, HEAD (the GET head, no body) and OPTIONS (``Allow``); another
method on a known path is 405 with ``Allow``. Operator endpoints are off the tenants' port: on the
``--admin-listen`` listener when there is one; without it on the main listener to loopback
clients only, and to anyone else a 404 as for an unknown path.

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
import random
import socket
import time
from collections.abc import Awaitable, Sequence
from typing import Any, cast

from dataplane.router import balancer
from dataplane.router.admission import (
    DEFAULT_ADMISSION,
    clamp_tenant_priority,
    is_probe,
    make_admission,
    queue_for_pod,
)
from dataplane.router.affinity import pick_sticky, workload_of
from dataplane.router.config import RouterConfig
from dataplane.router.control_plane import ControlPlaneClient, Fetch, TableFreshness, follow
from dataplane.router.delivery import Delivery, Send, Spool, router_id
from dataplane.router.discovery import STATIC_ENDPOINT, Discovery
from dataplane.router.endpoint_state import EndpointState
from dataplane.router.exposition import metrics_text, write_snapshot
from dataplane.router.http import ClientConnection, Request, RequestError, ServerState
from dataplane.router.keys import KeyBook
from dataplane.router.metering import Meter, publish
from dataplane.router.pricing import estimate_input_tokens
from dataplane.router.proxy import Exchange, UpstreamFailed, build_request, pod_body
from dataplane.router.ratelimit import InProcessLimiter, Limiter, TrafficClass
from dataplane.router.served_name import AnswerName, served_instead
from dataplane.router.upstream import Pool, fetch
from dataplane.router.validation import check_context, demand
from dataplane.router.workers import WorkerReadiness
from dataplane.wire import json_depth
from dataplane.wire.load_samples import RouterSecond, Sample
from dataplane.wire.prometheus_text import CONTENT_TYPE
from dataplane.wire.routing_table import RoutingTable

log = logging.getLogger("dataplane.router")

COMPLETIONS = b"/v1/completions"
CHAT = b"/v1/chat/completions"
PROMETHEUS_TEXT = b"content-type: %s\r\n" % CONTENT_TYPE.encode()
# The methods each path answers (the Allow header of OPTIONS and 405); HEAD is GET without a body.
PROXIED = (b"POST", b"OPTIONS")
READ_ONLY = (b"GET", b"HEAD", b"OPTIONS")
FINAL_FLUSH_TIMEOUT_S = 2.0  # delivering the held seconds on shutdown, s
TENANT_PATHS = {COMPLETIONS: PROXIED, CHAT: PROXIED, b"/v1/models": READ_ONLY, b"/health": READ_ONLY}
# Served on the admin listener (/health too, for probes there); on the main one to loopback only.
OPERATOR_PATHS = {b"/metrics": READ_ONLY, b"/health": READ_ONLY}
# Answers that say the pod is broken count toward its ejection like a refused connection; a 503
# (overloaded, draining) or a 4xx is the pod working as it should.
POD_FAULTS = frozenset({500, 502, 504})


def json_body(raw: bytes) -> tuple[dict[str, Any], str]:
    """The request's JSON object and the model it names; 400 when it is not one or names none."""
    try:
        body = json_depth.loads(raw)
    except json_depth.TooDeep as exc:  # a RecursionError, and a traceback, before the bound
        raise RequestError(400, str(exc), "invalid_json") from None
    except (ValueError, UnicodeDecodeError):
        raise RequestError(400, "request body is not valid JSON", "invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object", "invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(400, "you must provide a model parameter", "missing_model")
    return body, model


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
        admin_listen: tuple[str, int] | None = None,
        probe_key: bytes | None = None,
        readiness: WorkerReadiness | None = None,
        spool: Spool | None = None,
        pod_keys: Sequence[str] = (),
    ) -> None:
        self.config = config
        # The fleet credential, sent to pods as a bearer token: the key, then during a rotation
        # the one it replaces, tried when a pod answers 401 (b"" without one: open pods).
        self.pod_auths = [b"authorization: Bearer %s\r\n" % key.encode() for key in pod_keys] or [b""]
        self.pod_headers = [{"authorization": f"Bearer {key}"} for key in pod_keys] or [{}]  # its own calls
        self.readiness = readiness  # --workers N: ready only when every worker has its table
        self.probe_key = probe_key  # the prober credential (the probe header's value); None: no probes
        self.metrics_dir = metrics_dir  # shared by --workers N processes; None: one process
        # (host, port) of the operator endpoints' listener; None: the main one, loopback only
        self.admin_listen = admin_listen
        self.clock = time.monotonic
        self.limiter = limiter or InProcessLimiter(self.clock)
        self.admission = make_admission(DEFAULT_ADMISSION, self.limiter, config)
        self.fetch: Fetch = fetch
        self.control_plane = (
            ControlPlaneClient(control_plane, key, self.fetch, config.control_plane_timeout_s)
            if control_plane
            else None
        )
        self.redis = redis
        # Each metered second is held until its sink (Redis, else the control plane) takes it;
        # static mode without Redis meters for /metrics alone.
        send: Send | None = self.control_plane.post_samples if self.control_plane is not None else None
        if redis is not None:
            send = self._publish
        self.delivery = (
            Delivery(send, router_id(), config.metering_memory_bytes, spool, config.spool_max_bytes)
            if send is not None
            else None
        )
        self.rng = random.Random(seed)
        self.table: RoutingTable | None = None
        self.keys = KeyBook(
            self.control_plane.lookup_key if self.control_plane is not None else None,
            lambda: self.clock(),  # a test may set the router's clock after this
            config.key_lookups_per_s,
            config.key_lookup_burst,
            config.unknown_key_ttl_s,
            max_known=config.keys_known_max,
            max_unknown=config.unknown_keys_max,
        )
        self.freshness = TableFreshness(config.stale_table_after_s, config.stale_table == "fail-open")
        self.endpoints: dict[int, EndpointState] = {}
        self.by_tenant: dict[str, dict[str, EndpointState]] = {}
        self.pool = Pool(
            config.upstream_connect_timeout_s,
            config.upstream_idle_keepalive_s,
            config.max_idle_connections_per_pod,
        )
        self.meter = Meter(self.clock())
        self.state = ServerState(config, self.handle)
        self.admin_state = ServerState(config, self.handle_admin)
        self.table_loaded = asyncio.Event()
        self._probe_header = config.probe_header.lower().encode()
        self._probing: set[balancer.PodLoad] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._server: asyncio.AbstractServer | None = None
        self._admin_server: asyncio.AbstractServer | None = None

    # --- the hot path
    async def handle(self, client: ClientConnection, req: Request) -> None:
        """The main listener: proxy completions, else the router's own answers."""
        path = req.path.partition(b"?")[0]
        try:
            if req.method == b"POST" and (path == COMPLETIONS or path == CHAT):
                await self.proxy(client, req, path == CHAT)
                return
            methods = TENANT_PATHS.get(path)
            if methods is None and self.admin_listen is None and path in OPERATOR_PATHS:
                methods = OPERATOR_PATHS[path] if client.peer_is_loopback() else None
            await self.answer(client, req, path, methods)
        except RequestError as e:
            client.send_error(e.status, e.message, e.code, e.headers, e.param, e.kind)

    async def handle_admin(self, client: ClientConnection, req: Request) -> None:
        """The admin listener (``--admin-listen``): the operator endpoints only."""
        path = req.path.partition(b"?")[0]
        try:
            await self.answer(client, req, path, OPERATOR_PATHS.get(path))
        except RequestError as e:
            client.send_error(e.status, e.message, e.code, e.headers, e.param, e.kind)

    async def answer(
        self, client: ClientConnection, req: Request, path: bytes, methods: tuple[bytes, ...] | None
    ) -> None:
        """The router's own answer on ``path``, which takes ``methods`` (None: not served here)."""
        method = req.method
        if methods is None:
            raise RequestError(404, f"no route for {method.decode()} {path.decode('latin-1')}", "not_found")
        allow = b"allow: %s\r\n" % b", ".join(methods)
        if method == b"OPTIONS":
            client.send_response(200, allow, b"")
        elif method not in methods:
            raise RequestError(
                405,
                f"{method.decode()} is not allowed on {path.decode('latin-1')}; "
                f"use {b', '.join(m for m in methods if m != b'OPTIONS').decode()}",
                "method_not_allowed",
                allow,
            )
        elif path == b"/v1/models":
            client.send_json(200, await self.models(req))
        elif path == b"/metrics":
            text = metrics_text(self.meter.totals, self.endpoints.values(), self.metrics_dir)
            text += self.freshness.metrics_text(self.clock()) + self.limiter.metrics_text()
            text += self.keys.metrics_text()
            text += self.delivery.metrics_text() if self.delivery is not None else ""
            client.send_response(200, PROMETHEUS_TEXT, text.encode())
        else:  # /health
            ready = self.table is not None and not self.state.draining
            ready = ready and (self.readiness is None or self.readiness.all_ready())
            client.send_json(200 if ready else 503, {"status": "ok" if ready else "unavailable"})

    async def proxy(self, client: ClientConnection, req: Request, chat: bool) -> None:
        """Price the request, admit it, forward it (queueing, retrying), meter what it cost
        (``chat``: on /v1/chat/completions, else /v1/completions)."""
        cfg = self.config
        tenant = await self.tenant_of(req)
        body, model = json_body(req.body)
        ep = self.endpoint_for(tenant, model)
        spec = ep.spec  # this request's, whatever a reload installs meanwhile
        key = (spec.id, tenant)
        asked = demand(body, chat, spec.max_model_len, cfg.max_n, cfg.default_max_tokens)
        most_out, image_tokens = asked.output_tokens, asked.images.image_tokens
        tokens_in = estimate_input_tokens(body, chat) + image_tokens  # the engine counts both
        if tokens_in > spec.max_model_len:  # never below the fewest tokens the prompt can be
            check_context(body, chat, spec.max_model_len, spec.max_token_bytes, image_tokens)
        cost = spec.coefficients.cost(tokens_in, most_out, 0, image_tokens)  # the admission estimate
        # without a prober credential nothing is a probe: no header to read
        probe = self.probe_key is not None and is_probe(req.headers.get(self._probe_header), self.probe_key)
        if not probe and "priority" in body and clamp_tenant_priority(body):
            req.body = json.dumps(body).encode()  # the tenant's priority raised to its range
        # each tenant's own prefix cache on the pods (cache_salt); static mode has no tenants
        served = served_instead(spec, model)  # a renamed endpoint's pods serve their first name
        forwarded, hide_usage, strip_usage = pod_body(req.body, body, tenant or None, served)
        exch = Exchange(
            client,
            spec.coefficients,
            (tokens_in, most_out),
            hide_usage,
            chat,
            cfg.upstream_read_timeout_s,
            cfg.max_body_bytes,
            image_tokens,
            strip_usage,
            asked.prompts == 1,
            None if served is None else AnswerName(served, model),
        )
        t0 = self.clock()
        started = False  # metered as in flight from its first attempt at a pod
        try:
            priority = await self.admission.admit(ep, cost, probe, t0) is not TrafficClass.BEST_EFFORT
            workload = workload_of(req.headers, body)
            deadline = t0 + cfg.queue_wait_s
            tried: list[balancer.PodLoad] = []  # pods whose connection failed before any byte
            while True:
                pod = self.pick(ep, workload, tried)
                if pod is None:
                    deadline = await queue_for_pod(
                        ep, cost, priority, tried, deadline, model, self.clock, self.wake
                    )
                    continue
                if not started:
                    self.meter.start(key, self.clock())
                    started = True
                ok = await self.forward(
                    client, req, forwarded, ep, pod, cost, len(tried) + 1 < cfg.max_attempts, exch
                )
                if ok:
                    break
                tried.append(pod)
        except BaseException as exc:
            end = self.clock()
            if started:  # cut short (client gone, pod lost): what was delivered (pricing.metered)
                exch.client_cut = client.closed and exch.sent
                # A client that went away while its answer flowed stopped it: no platform error
                # (errors: 5xx and upstream failures, what on-call alerts on). One that left a
                # silent pod gave up on a stall, and a draining router's cut is the router's:
                # an error, which costs nothing.
                error = exch.failed = (
                    not exch.client_cut
                    or exch.status >= 500
                    or self.state.draining
                    or exch.pod_silent_s() >= cfg.gave_up_after_silence_s
                )
                mu, tin, tout = exch.price()
                self.admission.settle(ep, probe, cost, mu)
                self.meter.finish(key, end, end - t0, mu, tin, tout, error)
            elif isinstance(exc, RequestError):
                self.meter.reject(key, end, exc.status)
            raise
        mu, tin, tout = exch.price()
        self.admission.settle(ep, probe, cost, mu)
        end = self.clock()
        self.meter.finish(key, end, end - t0, mu, tin, tout, exch.status >= 500)

    async def forward(
        self,
        client: ClientConnection,
        req: Request,
        body: bytes,
        ep: EndpointState,
        pod: balancer.PodLoad,
        cost: float,
        may_retry: bool,
        exch: Exchange,
    ) -> bool:
        """Send ``body`` to ``pod``; True when answered (``exch`` says what), False to retry
        elsewhere."""
        host, port, host_hdr, pod_hdr = ep.addresses[pod.url]
        pod.acquire(cost)
        exch.unanswered, exch.unanswered_mu = pod, cost
        ep.inflight += 1
        conn = None
        reusable = False
        try:
            for auth in self.pod_auths:
                if conn is not None and (conn.closed or not conn.keep_alive):  # a refusal closed it
                    self.pool.release(host, port, conn, False)
                    conn = None
                if conn is None:
                    try:
                        conn, reused = await self.pool.acquire(host, port)
                    except (OSError, TimeoutError) as exc:
                        self._failed(pod, f"connect: {exc!r}")
                        if may_retry:
                            return False
                        raise RequestError(
                            502, f"could not connect to a pod: {exc}", "upstream_unreachable"
                        ) from None
                request = build_request(req.method, req.path, host_hdr, req.headers, body, auth)
                head, done = exch.send(conn, pod_hdr, request)
                try:
                    await head
                except UpstreamFailed as exc:
                    if not reused:  # a stale pooled socket is not the pod's fault
                        self._failed(pod, str(exc))
                    if may_retry:
                        return False
                    raise RequestError(
                        502, "the pod closed the connection before answering", "upstream_failed"
                    ) from None
                if not exch.refused:
                    break
                await done  # the refusal read and dropped: the next key (a rotation)
            if exch.refused:  # a misconfigured fleet: the tenant's key is not the one at fault
                log.error("pod %s refused the router's fleet key (--pod-key-file)", pod.url)
                raise RequestError(502, "a pod refused the router's credential", "upstream_refused")
            try:
                await done
            except UpstreamFailed as exc:
                log.warning("pod %s lost mid-answer: %s", pod.url, exc)
                # The platform's failure (502: it costs nothing), unless the endpoint has left
                # the table: its tenant deleted it, its pods stop with their streams, and what
                # a stream was sent is billed (pricing.metered), as when its client cuts it.
                if exch.status < 500 and ep.spec.id in self.endpoints:
                    exch.status = 502
                if not client.response_started:  # a held JSON answer: nothing sent yet
                    raise RequestError(
                        502, "the pod's connection was lost mid-answer", "upstream_failed"
                    ) from None
                client.abort()  # mid-stream: cut the client too, never splice another pod in
                return True
            finally:
                exch.cancel_timer()
            if exch.status in POD_FAULTS:
                self._failed(pod, f"answered {exch.status}")
            else:
                balancer.record_success(pod)
            reusable = True
            return True
        finally:
            if conn is not None:
                if conn.sink is not None:  # cancelled mid-exchange: the pod must stop working
                    conn.sink = None
                    conn.close()
                self.pool.release(host, port, conn, reusable)
            pod.release(cost, answered=exch.unanswered is None)
            exch.unanswered = None
            ep.inflight -= 1
            ep.wake_one()

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

    def _failed(self, pod: balancer.PodLoad, reason: str) -> None:
        if balancer.record_failure(
            pod, self.clock(), self.config.eject_after_failures, self.config.eject_backoff_s
        ):
            log.warning("pod %s ejected after %d failures (%s)", pod.name, pod.consecutive_failures, reason)

    def wake(self, endpoint_id: int) -> None:
        """Ask the control plane, in the background, to start a scaled-to-zero endpoint's pod."""
        if self.control_plane is not None:
            self._spawn(self.control_plane.wake(endpoint_id))

    # --- routing table
    def confirm_table(self) -> None:
        """The control plane confirmed the table in use (discovery's ``on_confirmed``)."""
        self.freshness.confirm(self.clock())

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
        self.keys.apply(table)
        self.endpoints, self.by_tenant, self.table = endpoints, by_tenant, table
        self.table_loaded.set()
        if self.readiness is not None:
            self.readiness.mark_ready()
        log.info("routing table %s: %d endpoints", table.version, len(endpoints))

    async def tenant_of(self, req: Request) -> str:
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
        self.freshness.check(self.clock(), time.time())  # keys from a stale table: 503
        auth = req.headers.get(b"authorization", b"")
        if not auth[:7].lower() == b"bearer " or len(auth) <= 7:
            raise RequestError(401, "missing API key: send Authorization: Bearer <key>", "missing_api_key")
        return await self.keys.tenant(hashlib.sha256(auth[7:].strip()).hexdigest())

    def endpoint_for(self, tenant: str, model: str) -> EndpointState:
        eps = self.by_tenant.get(tenant, {})
        ep = eps.get(model) or eps.get(STATIC_ENDPOINT)
        if ep is None:
            raise RequestError(
                404, f"the model {model!r} does not exist or you do not have access to it", "model_not_found"
            )
        return ep

    async def models(self, req: Request) -> dict[str, Any]:
        """The tenant's endpoints as OpenAI models (vLLM's ModelCard fields). In static mode the
        router knows no model names, so it lists what a ready pod serves."""
        tenant = await self.tenant_of(req)
        endpoints = self.by_tenant.get(tenant, {})
        if STATIC_ENDPOINT in endpoints:
            return await self.pod_models(endpoints[STATIC_ENDPOINT])
        data = [
            {
                "id": name,
                "object": "model",
                "created": ep.created,
                "owned_by": tenant or "router",
                "root": ep.spec.model,
            }
            for name, ep in sorted(endpoints.items())
        ]
        return {"object": "list", "data": data}

    async def pod_models(self, ep: EndpointState) -> dict[str, Any]:
        """The model list of the first ready pod that answers it; 503 when none does."""
        for pod in [p for p in ep.pods if p.ready and not p.ejected]:
            listed = None
            for headers in self.pod_headers:  # the fleet key, then (rotating) the one it replaces
                try:
                    status, _, body = await self.fetch(
                        f"{pod.url}/v1/models", "GET", dict(headers), b"", self.config.upstream_read_timeout_s
                    )
                    listed = json.loads(body) if status == 200 else None
                except (OSError, TimeoutError, ConnectionError, ValueError):
                    break
                if status != 401:
                    break
            if isinstance(listed, dict) and isinstance(listed.get("data"), list):
                return listed
        raise RequestError(
            503, "no pod answers /v1/models", "no_pods", b"retry-after: %d\r\n" % self.config.retry_after_s
        )

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
        """Every second: tick, then hand the second's rows (and that this router was up) to the
        delivery, which sends them to Redis, or without Redis in control-plane mode to the
        control plane."""
        while True:
            await asyncio.sleep(interval_s)
            self.flush(self.tick())

    def flush(self, rows: list[Sample]) -> None:
        """Hold a rolled window's rows as the second that just ended, for delivery (and write
        this worker's snapshot for /metrics)."""
        if self.metrics_dir is not None:
            write_snapshot(self.meter.totals, self.endpoints.values(), self.metrics_dir)
        if self.delivery is not None:
            self.delivery.add(rows, int(time.time()) - 1)

    async def _publish(self, posted: RouterSecond) -> None:
        if not await publish(
            self.redis, posted, self.config.metrics_ttl_s, self.config.billing_stream_max_entries
        ):
            log.info("metered second %s was published before (a retry): not added again", posted.second)

    # --- lifecycle
    async def start(
        self,
        host: str,
        port: int,
        discovery: Discovery,
        reuse_port: bool = False,
        sock: socket.socket | None = None,
    ) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(follow(discovery, self.apply)))
        self._tasks.append(asyncio.get_running_loop().create_task(self.maintenance()))
        if self.delivery is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self.delivery.run()))
        self._tasks.append(asyncio.get_running_loop().create_task(self.limiter.run()))  # leases
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
        if self.admin_listen is not None:
            admin_host, admin_port = self.admin_listen
            self._admin_server = await loop.create_server(
                lambda: ClientConnection(self.admin_state),
                admin_host,
                admin_port,
                reuse_port=reuse_port or None,
            )

    @property
    def port(self) -> int:
        server = cast(asyncio.Server, self._server)
        return int(server.sockets[0].getsockname()[1])

    @property
    def admin_port(self) -> int:
        server = cast(asyncio.Server, self._admin_server)
        return int(server.sockets[0].getsockname()[1])

    async def shutdown(self, drain_timeout_s: float | None = None) -> int:
        """Stop accepting, let in-flight requests finish for a bounded time, then cancel them.
        Returns the number of requests cut at the deadline."""
        timeout = self.config.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        st = self.state
        st.draining = True
        if self._server is not None:
            self._server.close()
        if self._admin_server is not None:
            self._admin_server.close()  # its answers are immediate: nothing to drain
            for c in list(self.admin_state.connections):
                c.abort()
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
        for server in (self._server, self._admin_server):
            if server is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server.wait_closed(), 1.0)
        # The requests that finished since the last second's flush (those the drain let finish,
        # those cut at its deadline) are billed too: without this they were never published.
        self.flush(self.meter.roll(self.clock()))
        if self.delivery is not None:
            with contextlib.suppress(TimeoutError):  # bounded: a sink that hangs must not hold the exit
                await asyncio.wait_for(self.delivery.deliver(), FINAL_FLUSH_TIMEOUT_S)
            self.delivery.close()  # what is left stays in the spool for the next start
        return cut
