"""``python -m dataplane.router``: run the router (static or control-plane mode).

    python -m dataplane.router --listen 127.0.0.1:8080 --backends http://a:9001,http://b:9001 --policy p2c-mu
    ROUTER_KEY=<operator key> python -m dataplane.router --listen 0.0.0.0:8080 \\
        --control-plane http://cp:8000 [--key-file PATH] [--redis redis://...] [--workers 4] \\
        [--endpointslices mu-runtime] [--admin-listen 0.0.0.0:9090] \\
        [--stale-table-after-s 600] [--stale-table fail-open] [--spool-dir /var/spool/router]

Keys never come from the command line (``dataplane.keys``): the operator key from ``$ROUTER_KEY``
or ``--key-file``, the fleet key it sends pods from ``--pod-key-file`` (mode 600) or
``$ROUTER_POD_KEY``. ``--workers N`` forks N processes on one SO_REUSEPORT address; SIGTERM or
SIGINT drains them. What each flag does: docs/router.md, "Starting it".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import resource
import shutil
import signal
import sys
import tempfile
from dataclasses import fields, replace

from capacity.units import DEFAULT_MAX_MODEL_LEN
from dataplane.keys import add_key_arguments, read_fleet_keys, read_key
from dataplane.router.balancer import DEFAULT_POLICY, POLICY_NAMES
from dataplane.router.config import RouterConfig
from dataplane.router.delivery import Spool, SpoolBusy
from dataplane.router.discovery import ControlPlaneDiscovery, Discovery, StaticDiscovery, static_table
from dataplane.router.lease_limiter import LeasedLimiter
from dataplane.router.ratelimit import InProcessLimiter, Limiter
from dataplane.router.server import Router
from dataplane.router.workers import WorkerReadiness

log = logging.getLogger("dataplane.router")
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def raise_nofile_limit() -> int:
    """Raise RLIMIT_NOFILE to the hard limit: each proxied request holds two sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def listen_address(text: str) -> tuple[str, int]:
    """ "host:port" (an IPv6 host in brackets) -> (host, port); argparse reports the error."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected host:port (port 0-65535), got {text!r}")
    return host, int(port)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dataplane.router", description=__doc__.split("\n")[0])
    p.add_argument("--listen", type=listen_address, default="127.0.0.1:8080", help="host:port")
    p.add_argument(
        "--admin-listen",
        type=listen_address,
        default=None,
        help="host:port of the operator endpoints (/metrics); without it they answer on --listen "
        "to loopback clients only",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--backends", help="static mode: comma-separated pod URLs")
    src.add_argument("--control-plane", help="control-plane mode: base URL of the control plane")
    add_key_arguments(p, "--key", "ROUTER_KEY", "operator key")
    add_key_arguments(p, "--pod-key", "ROUTER_POD_KEY", "fleet key the pods accept (mode 600)")
    p.add_argument(
        "--endpointslices",
        metavar="NAMESPACE",
        default=None,
        help="control-plane mode on Kubernetes: pods from the EndpointSlices of this namespace",
    )
    p.add_argument("--policy", default=DEFAULT_POLICY, choices=POLICY_NAMES, help="static mode policy")
    p.add_argument(
        "--target-concurrency",
        type=int,
        default=0,
        help="static mode: in-flight requests per pod before queueing (0 = unlimited)",
    )
    p.add_argument(
        "--rate-limit-mu-per-min",
        type=float,
        default=0.0,
        help="static mode: a reservation (MU/min) for all traffic (0 = none); with --redis, "
        "enforced across every router (and worker) sharing that Redis, else per process",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=DEFAULT_MAX_MODEL_LEN,
        help="static mode: the pods' context length, tokens; a larger output budget is a 400 "
        f"(default {DEFAULT_MAX_MODEL_LEN})",
    )
    p.add_argument(
        "--probe-key-file",
        default=None,
        help="file holding the prober credential (else $ROUTER_PROBE_KEY): a request whose "
        "x-probe header carries it is a health probe, never shed; without one, nothing is",
    )
    p.add_argument(
        "--redis",
        default=None,
        help="Redis URL: reservations leased across the routers sharing it, per-second load metrics",
    )
    p.add_argument(
        "--limiter-namespace",
        default=None,
        help="with --redis: the deployment whose routers share leases (the lease keys hold it); "
        "default: the --control-plane URL, or 'static' in static mode, so that routers started "
        "with one command line share; give a second static fleet on the same Redis its own",
    )
    p.add_argument(
        "--spool-dir",
        default=None,
        help="with --redis or --control-plane: a directory (made 0700) where metered seconds wait, "
        "one file each, until their sink acknowledges them; kept across restarts",
    )
    p.add_argument("--workers", type=int, default=1, help="processes sharing the port (SO_REUSEPORT)")
    p.add_argument("--log-level", default="warning", help="Python logging level: debug, info, warning, error")
    for f in fields(RouterConfig):
        p.add_argument(
            "--" + f.name.replace("_", "-"),
            type=type(f.default),
            default=None,
            help=f"RouterConfig.{f.name} (default {f.default})",
        )
    args = p.parse_args(argv)
    args.metrics_dir = None  # set by main() for --workers > 1
    try:
        args.key = read_key(args.key_file, "ROUTER_KEY")
        probe_key = read_key(args.probe_key_file, "ROUTER_PROBE_KEY")
        args.pod_keys = read_fleet_keys(args.pod_key_file, "ROUTER_POD_KEY")
    except ValueError as exc:
        p.error(str(exc))
    args.probe_key = probe_key.encode() if probe_key else None  # None: no request is a probe
    if args.control_plane and not args.key:
        p.error("--control-plane needs the operator key: $ROUTER_KEY or --key-file PATH")
    if args.endpointslices and not args.control_plane:
        p.error("--endpointslices needs --control-plane (endpoints and keys come from there)")
    if args.admin_listen and args.admin_listen[1] == args.listen[1] != 0:
        # With --workers, every socket is SO_REUSEPORT: both would bind, and the kernel would
        # hand clients' connections to the operator endpoints (404) at random.
        p.error(f"--admin-listen must use another port than --listen ({args.listen[1]})")
    if args.spool_dir and not (args.redis or args.control_plane):
        p.error("--spool-dir needs a sink for the metered seconds: --redis or --control-plane")
    if args.max_model_len < 1:
        p.error(f"--max-model-len must be >= 1, got {args.max_model_len}")
    try:
        build_config(args)
    except ValueError as exc:  # a bad value of a RouterConfig field, named
        p.error(str(exc))
    return args


def lease_prefix(args: argparse.Namespace) -> str:
    """The Redis key prefix of this deployment's leases: endpoint ids are only unique within one
    control plane (and every static table's endpoint is 0), so the deployment is in the key."""
    namespace = args.limiter_namespace
    if namespace is None:
        namespace = args.control_plane.rstrip("/") if args.control_plane else "static"
    return f"mu:lease:{namespace}:"


def build_config(args: argparse.Namespace) -> RouterConfig:
    overrides = {
        f.name: getattr(args, f.name) for f in fields(RouterConfig) if getattr(args, f.name) is not None
    }
    return replace(RouterConfig(), **overrides)


def open_spool(directory: str, worker: int, workers: int) -> Spool:
    """This worker's spool, ``directory/worker-{worker}``; the first worker adopts the seconds
    of workers past ``workers`` (nobody else would send them). SystemExit naming the directory
    when another process holds it."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)  # one given (a volume) keeps its mode
        spool = Spool(os.path.join(directory, f"worker-{worker}"))
        if worker == 0:
            for name in sorted(os.listdir(directory)):
                index = name.removeprefix("worker-")
                if index.isdigit() and int(index) >= workers:
                    spool.adopt(os.path.join(directory, name))
    except (SpoolBusy, OSError) as exc:
        raise SystemExit(f"--spool-dir: {exc}") from None
    return spool


async def serve(
    args: argparse.Namespace, sock_reuse: bool, readiness: WorkerReadiness | None = None, worker: int = 0
) -> None:
    config = build_config(args)
    host, port = args.listen
    redis = None
    limiter: Limiter = InProcessLimiter(asyncio.get_running_loop().time)
    if args.redis:
        from redis.asyncio import Redis

        redis = Redis.from_url(args.redis, socket_timeout=0.5, socket_connect_timeout=0.5)
        limiter = LeasedLimiter(redis, asyncio.get_running_loop().time, prefix=lease_prefix(args))
    router = Router(
        config,
        limiter=limiter,
        control_plane=args.control_plane,
        key=args.key,
        redis=redis,
        metrics_dir=args.metrics_dir,
        admin_listen=args.admin_listen,
        probe_key=args.probe_key,
        pod_keys=args.pod_keys,
        readiness=readiness,
        spool=open_spool(args.spool_dir, worker, args.workers) if args.spool_dir else None,
    )
    discovery: Discovery
    if args.backends:
        table = static_table(
            [b.strip() for b in args.backends.split(",") if b.strip()],
            args.policy,
            args.target_concurrency,
            args.rate_limit_mu_per_min or None,
            max_model_len=args.max_model_len,
        )
        discovery = StaticDiscovery(table)
    else:
        from dataplane.router.control_plane import TablePush
        from dataplane.router.upstream import fetch

        discovery = ControlPlaneDiscovery(
            args.control_plane,
            args.key,
            fetch,
            config.poll_interval_s,
            config.control_plane_timeout_s,
            on_confirmed=router.confirm_table,
            push=TablePush(args.redis) if args.redis else None,  # poll on change, not every second
        )
        if args.endpointslices:
            from dataplane.router.endpointslices import EndpointSliceDiscovery

            discovery = EndpointSliceDiscovery(discovery, args.endpointslices)
    await router.start(host, port, discovery, reuse_port=sock_reuse)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # a SIGTERM that came early lands now
    admin = f", operator endpoints on {args.admin_listen[0]}:{router.admin_port}" if args.admin_listen else ""
    log.warning("router listening on %s:%d%s (pid %d)", host, router.port, admin, os.getpid())
    await stop.wait()
    cut = await router.shutdown()
    if redis is not None:
        await redis.aclose()
    log.warning("router drained (%d requests cut at the deadline)", cut)


def tune_gc() -> None:
    """Startup objects (modules, config) are never garbage: keep them out of every scan.

    Raising the gen-0 threshold (50,000) showed no p99 gain we could measure on a shared 2-core
    machine and let cyclic garbage pile up (RSS +260 KB per 40k requests until a late gen-2 pass),
    so the thresholds stay at Python's defaults (RSS flat at ~36 MB over 200k requests)."""
    gc.freeze()


def run_worker(
    args: argparse.Namespace, reuse_port: bool, readiness: WorkerReadiness | None = None, worker: int = 0
) -> None:
    tune_gc()
    try:
        import uvloop

        uvloop.run(serve(args, reuse_port, readiness, worker))
    except ImportError:  # pragma: no cover - uvloop is a dependency; stay usable without it
        asyncio.run(serve(args, reuse_port, readiness, worker))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    raise_nofile_limit()
    # blocked until each process has its handlers: a SIGTERM during startup drains, not kills
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    if args.workers <= 1:
        run_worker(args, reuse_port=False)
        return 0
    # The workers' counters meet in one directory, so any worker's /metrics shows them all.
    args.metrics_dir = tempfile.mkdtemp(prefix="router-metrics-")
    children = []
    readiness = WorkerReadiness(args.workers)  # before the fork: shared by every worker
    for index in range(args.workers):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                run_worker(args, reuse_port=True, readiness=readiness.of_worker(index), worker=index)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                log.exception("router worker %d failed", index)
            finally:
                os._exit(code)
        children.append(pid)
    alive = set(children)
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for c in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(c, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    status = 0
    while alive:
        pid, st = os.wait()
        alive.discard(pid)
        code = os.waitstatus_to_exitcode(st)
        status = status or code
        if alive and not stopping:
            # A worker gone on its own (a crash, a failed bind): the rest are stopped and the
            # process exits non-zero, so its supervisor restarts the router whole rather than
            # leave it short of a worker (or never ready, its byte unset).
            log.error("router worker (pid %d) exited with %d: stopping the others", pid, code)
            status = status or 1
            forward(signal.SIGTERM, None)
    shutil.rmtree(args.metrics_dir, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
