"""The local cluster: keeps each deployment's replicas running as supervised local processes
(what a kubelet and a ReplicaSet controller do on one machine, for ``dataplane.cluster.local``).

    python -m dataplane.cluster.agent --listen 127.0.0.1:8700 --token-file var/keys/agent.token \\
        [--warm-pool 2] [--log-dir var/pods] [--control-plane URL] [--vllm-python PY]

Every call but GET /healthz carries ``Authorization: Bearer <token>`` (else 401). A declared
deployment chooses what its pods serve, never what runs: its engine and arguments are checked
against ``dataplane.cluster.pod_args`` (400 naming the argument), and no pod gets the operator
key. A reconcile pass every 0.25 s starts missing replicas, retires extra ones and rolls a
deployment redeclared with another spec (surge, then retire). The HTTP API and the rules:
docs/runtime-pods.md, "The cluster agent".
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import itertools
import json
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from dataplane.cluster.driver import Deployment, PodState
from dataplane.cluster.pod_args import with_own
from dataplane.keys import add_key_arguments, read_fleet_keys, read_key, read_private_file
from dataplane.runtime.events import EventReporter, ReporterConfig
from dataplane.runtime.http_server import HttpServer, Request, Response, json_response
from dataplane.runtime.pod_process import PodLaunch
from dataplane.runtime.supervisor import Supervisor, SupervisorConfig
from dataplane.runtime.warm_pool import WarmPoolConfig
from dataplane.wire.pod_events import attribution

log = logging.getLogger("dataplane.cluster.agent")
# The operator key for the agent's own events; never in a pod's environment (pod_process).
KEY_VARIABLE = "MU_CONTROL_PLANE_KEY"
# A pod's events credential, its deployment's (dataplane.runtime.pod reads it there).
EVENTS_KEY_VARIABLE = "MU_POD_EVENTS_KEY"
POD_KEY_VARIABLE = "VLLM_API_KEY"  # the fleet key, where vLLM (and the simulated engine) reads it


@dataclass
class Replica:
    name: str
    deployment: str
    port: int
    probe_port: int
    started_at: float  # monotonic s
    retiring_since: float | None = None  # monotonic s; None while it serves
    spec: str = ""  # launch_spec of the deployment it started from
    slot: int = 0  # its replica slot in the deployment (pod_name)


def pod_name(deployment: str, slot: int, serial: int) -> str:
    """'ep-7-v1', slot 0, serial 13 -> 'ep-7-v1-r0-13': the deployment, the replica slot (0 up to
    its replicas, reused by the pod that replaces one), and a serial that keeps names unique."""
    return f"{deployment}-r{slot}-{serial}"


def launch_spec(d: Deployment) -> str:
    """A digest of what a deployment's pods are started with (not its replicas or target
    concurrency, which change without a restart): pods of another spec are rolled."""
    fields = [d.engine, list(d.args), sorted(d.labels.items()), d.events_key]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:16]


def plan(
    deployments: dict[str, Deployment], replicas: Sequence[Replica], ready: set[str]
) -> tuple[dict[str, int], list[str]]:
    """Pure: (replicas to start per deployment, names of pods to retire). Retires the not-ready
    first, then the newest, so scale-down never takes a serving pod while a starting one stays.
    Pods of an outdated launch spec are replaced: the new ones start at once, and the old ones
    go as the new ones become ready (the old kept are as many as ready new ones fall short)."""

    def retire_order(rs: list[Replica]) -> list[Replica]:
        return sorted(rs, key=lambda r: (r.name in ready, -r.started_at))

    serving: dict[str, list[Replica]] = {}
    retire: list[str] = []
    for r in replicas:
        if r.retiring_since is not None:
            continue
        if r.deployment not in deployments:
            retire.append(r.name)
        else:
            serving.setdefault(r.deployment, []).append(r)
    start: dict[str, int] = {}
    for name, d in deployments.items():
        spec = launch_spec(d)
        current = [r for r in serving.get(name, []) if r.spec == spec]
        outdated = [r for r in serving.get(name, []) if r.spec != spec]
        if len(current) < d.replicas:
            start[name] = d.replicas - len(current)
        elif len(current) > d.replicas:
            retire += [r.name for r in retire_order(current)[: len(current) - d.replicas]]
        shortfall = d.replicas - min(d.replicas, sum(r.name in ready for r in current))
        retire += [r.name for r in retire_order(outdated)[: max(0, len(outdated) - shortfall)]]
    return start, retire


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class Agent:
    def __init__(
        self,
        supervisor: Supervisor,
        host: str = "127.0.0.1",
        drain_delay_s: float = 5.0,
        pod_args: Callable[[Deployment], tuple[str, ...]] = lambda d: (),
        clock: Callable[[], float] = time.monotonic,
        token: str = "",
        pod_key: str = "",
    ) -> None:
        self.supervisor = supervisor
        self.host = host
        self.drain_delay_s = drain_delay_s
        self.pod_args = pod_args  # arguments every pod of a deployment gets (control plane, endpoint)
        self.clock = clock
        self._token = token.encode()  # every call but /healthz must carry it; "" refuses them all
        self.pod_key = pod_key  # the fleet key: each engine then answers only those bearing it
        self.deployments: dict[str, Deployment] = {}
        self.replicas: dict[str, Replica] = {}
        self._lock = threading.Lock()
        self._serial = itertools.count(1)
        self._stopping: list[threading.Thread] = []

    # --- the API's operations (thread-safe)
    def apply(self, deployments: Sequence[Deployment]) -> None:
        names = [d.name for d in deployments]
        if len(set(names)) != len(names):
            raise ValueError(f"deployment names repeat: {sorted(n for n in names if names.count(n) > 1)}")
        with self._lock:
            self.deployments = {d.name: d for d in deployments}

    def patch(
        self, name: str, replicas: int | None = None, target_concurrency: int | None = None
    ) -> Deployment:
        with self._lock:
            d = self.deployments.get(name)
            if d is None:
                raise KeyError(name)
            d = replace(
                d,
                replicas=d.replicas if replicas is None else replicas,
                target_concurrency=d.target_concurrency if target_concurrency is None else target_concurrency,
            )
            Deployment.from_json(d.to_json())  # validates the patched values
            self.deployments[name] = d
            return d

    def pods(self) -> list[PodState]:
        status = {p.name: p for p in self.supervisor.list_pods()}
        with self._lock:
            replicas = list(self.replicas.values())
        out = []
        for r in sorted(replicas, key=lambda r: r.name):
            s = status.get(r.name)
            out.append(
                PodState(
                    r.name,
                    r.deployment,
                    f"http://{self.host}:{r.port}",
                    ready=bool(s and s.ready) and r.retiring_since is None,
                    restarts=s.restarts if s else 0,
                    warm=bool(s and s.warm),
                    ready_after_s=s.ready_after_s if s else None,
                )
            )
        return out

    # --- reconciliation
    def reconcile_once(self) -> None:
        now = self.clock()
        ready = {p.name for p in self.supervisor.list_pods() if p.ready}
        with self._lock:
            start, retire = plan(self.deployments, list(self.replicas.values()), ready)
            for name in retire:
                self.replicas[name].retiring_since = now
            due = [
                r
                for r in self.replicas.values()
                if r.retiring_since is not None and now - r.retiring_since >= self.drain_delay_s
            ]
            for r in due:
                del self.replicas[r.name]
            starts = [(self.deployments[name], n) for name, n in start.items()]
        for r in due:  # SIGTERM and drain in the background: a slow pod must not stall the loop
            t = threading.Thread(target=self.supervisor.stop_pod, args=(r.name,), daemon=True)
            t.start()
            self._stopping.append(t)
        self._stopping = [t for t in self._stopping if t.is_alive()]
        for d, n in starts:
            for _ in range(n):
                self._start(d, now)

    def _start(self, d: Deployment, now: float) -> None:
        slot = self._free_slot(d.name)
        r = Replica(
            pod_name(d.name, slot, next(self._serial)),
            d.name,
            free_port(self.host),
            free_port(self.host),
            now,
            spec=launch_spec(d),
            slot=slot,
        )
        # Secrets go in the environment, which argv would show to ps.
        env: tuple[tuple[str, str], ...] = ((EVENTS_KEY_VARIABLE, d.events_key),) if d.events_key else ()
        env += ((POD_KEY_VARIABLE, self.pod_key),) if self.pod_key else ()
        launch = PodLaunch(
            r.name,
            d.engine,
            r.port,
            r.probe_port,
            args=with_own(d.args, self.pod_args(d)),
            env=env,
            host=self.host,
            attribution=attribution(d.labels),
        )
        self.supervisor.start_pod(launch)
        with self._lock:
            self.replicas[r.name] = r
        log.info("deployment %s: started pod %s on port %d", d.name, r.name, r.port)

    def _free_slot(self, deployment: str) -> int:
        """The lowest replica slot no serving pod of the deployment holds: a pod started in place
        of one that died takes its slot, so on-call counts a slot's restarts across pod names."""
        with self._lock:
            held = {
                r.slot
                for r in self.replicas.values()
                if r.deployment == deployment and r.retiring_since is None
            }
        return next(slot for slot in itertools.count() if slot not in held)

    def close(self) -> None:
        """Stop every pod (the supervisor's close) and wait for the drains under way."""
        with self._lock:
            self.deployments = {}
            self.replicas = {}
        self.supervisor.close()
        for t in self._stopping:
            t.join(timeout=self.supervisor.config.stop_grace_s + 5)

    # --- HTTP
    def authorized(self, request: Request) -> bool:
        scheme, _, secret = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not self._token:
            return False
        return hmac.compare_digest(secret.strip().encode(), self._token)

    async def handle(self, request: Request) -> Response:
        parts = [p for p in request.path.split("/") if p]
        if parts == ["healthz"]:
            return json_response(200, {"status": "ok"})
        if not self.authorized(request):
            return json_response(
                401,
                {"error": "every call needs Authorization: Bearer <the agent's token>"},
                {"WWW-Authenticate": "Bearer"},
            )
        try:
            if parts == ["pods"] and request.method == "GET":
                return json_response(200, {"pods": [p.to_json() for p in self.pods()]})
            if parts == ["deployments"] and request.method == "GET":
                with self._lock:
                    body = [d.to_json() for d in self.deployments.values()]
                return json_response(200, {"deployments": body})
            if parts == ["deployments"] and request.method == "PUT":
                payload = request.json()
                items = payload.get("deployments") if isinstance(payload, dict) else None
                if not isinstance(items, list):
                    raise ValueError('the body must be {"deployments": [...]}')
                self.apply([Deployment.from_json(item) for item in items])
                return json_response(200, {"deployments": len(items)})
            if len(parts) == 2 and parts[0] == "deployments" and request.method == "PATCH":
                payload = request.json()
                if not isinstance(payload, dict) or not set(payload) <= {"replicas", "target_concurrency"}:
                    raise ValueError(f"patch {payload!r}: only replicas and target_concurrency can change")
                try:
                    d = self.patch(parts[1], payload.get("replicas"), payload.get("target_concurrency"))
                except KeyError:
                    return json_response(404, {"error": f"no deployment {parts[1]!r}"})
                return json_response(200, d.to_json())
        except (ValueError, TypeError, json.JSONDecodeError) as exc:
            return json_response(400, {"error": str(exc)})
        return json_response(404, {"error": f"no route for {request.method} {request.path}"})


def control_plane_args(
    url: str | None, vllm_python: str | None = None
) -> Callable[[Deployment], tuple[str, ...]]:
    """Pods report hangs and restarts to the control plane, stamped with their endpoint (their
    events credential goes in their environment); vLLM pods run the agent's interpreter."""

    def args(d: Deployment) -> tuple[str, ...]:
        python: tuple[str, ...] = ("--vllm-python", vllm_python) if vllm_python and d.engine == "vllm" else ()
        if not url or not d.events_key:  # without a credential its events could not be posted
            return python
        endpoint, version, tenant = attribution(d.labels)
        extra: tuple[str, ...] = ("--endpoint-id", str(endpoint)) if endpoint else ()
        extra += ("--endpoint-version", str(version)) if version else ()
        extra += ("--tenant", tenant) if tenant else ()
        return ("--control-plane-url", url, *extra, *python)

    return args


async def serve(args: argparse.Namespace) -> None:
    key = args.key or ""
    reporter = EventReporter(ReporterConfig(url=args.control_plane, key=key, pod="agent"))
    supervisor = Supervisor(
        SupervisorConfig(
            check_interval_s=0.5,
            stop_grace_s=args.grace,
            log_dir=args.log_dir,
            warm_pool=WarmPoolConfig(size=args.warm_pool, engine=args.warm_engine),
        ),
        reporter,
    )
    agent = Agent(
        supervisor,
        args.host,
        args.drain_delay,
        control_plane_args(args.control_plane, args.vllm_python),
        token=args.token,
        pod_key=args.pod_key,
    )
    supervisor.start()
    server = HttpServer(agent.handle)
    host, _, port = args.listen.rpartition(":")
    bound = await server.start(host, int(port))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.warning("cluster agent listening on %s:%d", host, bound)
    while not stop.is_set():
        await asyncio.to_thread(agent.reconcile_once)
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except TimeoutError:
            pass
    for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut the pods' shutdown
        loop.remove_signal_handler(sig)
        signal.signal(sig, signal.SIG_IGN)
    log.warning("cluster agent stopping its pods")
    await server.close()
    await asyncio.to_thread(agent.close)
    reporter.close(2.0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dataplane.cluster.agent", description=__doc__.split("\n")[0])
    p.add_argument("--listen", default="127.0.0.1:8700", help="host:port of the agent's API")
    p.add_argument("--host", default="127.0.0.1", help="address pods listen on")
    p.add_argument(
        "--drain-delay", type=float, default=5.0, help="retired pod serves no new request this long, s"
    )
    p.add_argument("--grace", type=float, default=30.0, help="SIGTERM to SIGKILL of a stopping pod, s")
    p.add_argument("--log-dir", default=None, help="pods' stdout/stderr go to <dir>/<pod>.log")
    p.add_argument(
        "--warm-pool",
        type=int,
        default=0,
        help="pre-started runtime processes kept ready, so a new replica only loads its model",
    )
    p.add_argument("--warm-engine", choices=("sim", "vllm"), default="sim", help="engine of the warm pool")
    p.add_argument(
        "--token-file",
        required=True,
        metavar="PATH",
        help="the token every call must carry (Authorization: Bearer); a file of mode 600",
    )
    p.add_argument("--vllm-python", default=None, help="interpreter of vllm pods (default: this one)")
    p.add_argument("--control-plane", default=None, help="control plane URL for pod events")
    add_key_arguments(p, "--key", KEY_VARIABLE, "operator key for the agent's own events")
    add_key_arguments(p, "--pod-key", "MU_POD_KEY", "fleet key the pods accept (mode 600)")
    p.add_argument("--log-level", default="info", help="Python logging level: debug, info, warning, error")
    args = p.parse_args(argv)
    try:
        args.key = read_key(args.key_file, KEY_VARIABLE)
        args.pod_key = (read_fleet_keys(args.pod_key_file, "MU_POD_KEY") or [""])[0]  # pods take one
        args.token = read_private_file(args.token_file, "token")
    except ValueError as exc:
        p.error(str(exc))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
