"""Runs one runtime pod in the foreground: the engine as a child process plus the prober.

    python -m dataplane.runtime.pod --engine sim --port 8000 --probe-port 8001 \\
        --profile h100-llama-8b --time-scale 100
    python -m dataplane.runtime.pod --engine vllm --port 8000 --probe-port 8001 \\
        --model /models/llama --max-num-seqs 64 --api-server-count 2 -- --gpu-memory-utilization 0.9

``GET :probe-port/livez`` is 200 while the engine makes progress and 503 once the prober has
declared it hung; ``/readyz`` is 503 until the engine first answers. Like a container, the pod
does not restart its engine: if the engine exits, the pod exits with the engine's status and
whoever runs pods (Kubernetes, or ``supervisor`` locally) restarts it. SIGTERM is forwarded to
the engine, which gets ``--grace`` seconds to drain before it is killed.

Restart events from inside the pod: with ``--state-dir`` on a volume that outlives the
container (a Kubernetes emptyDir survives container restarts within the pod), the pod counts
its starts there and reports a ``restart`` event when it starts again. The local supervisor
reports restarts itself and does not pass ``--state-dir``.

The fleet credential: the pod's ``$VLLM_API_KEY`` (from the cluster agent, or a Kubernetes
Secret) reaches the engine in its environment, never its argv, and the engine then answers
only requests that bear it (the router's, the prober's); vLLM reads it itself, the simulated
engine as vLLM does (``engine_auth``). Without it the engine is open, as vLLM without a key.

``run_pod`` takes the function that starts the engine (``spawn_engine`` by default); a warm pod
(``warm``) passes one that hands the command to an engine interpreter it started beforehand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Protocol

from dataplane.keys import add_key_arguments, read_key
from dataplane.runtime import engine_auth, launcher
from dataplane.runtime.events import EventReporter, ReporterConfig, utc_now_iso
from dataplane.runtime.pod_process import PARENT_VARIABLE
from dataplane.runtime.probe_server import ProbeLoop
from dataplane.runtime.prober import ProberConfig
from engine_model.profiles import PROFILES

log = logging.getLogger("dataplane.runtime.pod")
# The endpoint's events credential (controlplane.endpoints.pod_keys): its own endpoint's events only.
EVENTS_KEY_VARIABLE = "MU_POD_EVENTS_KEY"


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    ours = argv[: argv.index("--")] if "--" in argv else argv
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m dataplane.runtime.pod")
    p.add_argument("--engine", choices=("sim", "vllm"), required=True, help="the simulated engine or vLLM")
    p.add_argument("--port", type=int, required=True, help="engine port")
    p.add_argument("--probe-port", type=int, required=True, help="/livez and /readyz port")
    p.add_argument("--host", default="127.0.0.1", help="listen address of both servers")
    p.add_argument("--name", default=env("POD_NAME", socket.gethostname()), help="pod name")
    p.add_argument("--grace", type=float, default=30.0, help="drain time on SIGTERM, s")
    p.add_argument(
        "--state-dir",
        default=env("MU_POD_STATE_DIR"),
        help="directory that outlives the container; enables restart events",
    )
    # Control plane (events), with this endpoint's events credential (never the operator key).
    p.add_argument(
        "--control-plane-url",
        default=env("MU_CONTROL_PLANE_URL"),
        help="where the pod posts its events (else $MU_CONTROL_PLANE_URL; without either, none are posted)",
    )
    add_key_arguments(p, "--events-key", EVENTS_KEY_VARIABLE, "endpoint's events credential")
    endpoint = env("MU_ENDPOINT_ID")
    p.add_argument(
        "--endpoint-id",
        type=int,
        default=int(endpoint) if endpoint else None,
        help="the endpoint the pod serves, on its events (else $MU_ENDPOINT_ID)",
    )
    version = env("MU_ENDPOINT_VERSION")
    p.add_argument(
        "--endpoint-version",
        type=int,
        default=int(version) if version else None,
        help="the endpoint version the pod runs, on its events (else $MU_ENDPOINT_VERSION)",
    )
    p.add_argument("--tenant", default=env("MU_TENANT", ""), help="the endpoint's tenant, on events")
    # Prober.
    d = ProberConfig()
    p.add_argument(
        "--idle-interval",
        type=float,
        default=d.idle_interval_s,
        help="probe after this long without progress, s",
    )
    p.add_argument(
        "--completion-deadline",
        type=float,
        default=d.completion_deadline_s,
        help="a probe unanswered this long has failed, s",
    )
    p.add_argument(
        "--failure-threshold",
        type=int,
        default=d.failure_threshold,
        help="failed probes in a row, without progress, that mean the engine hangs",
    )
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=d.startup_timeout_s,
        help="the engine must answer within this of its start, s",
    )
    p.add_argument(
        "--scrape-interval",
        type=float,
        default=d.scrape_interval_s,
        help="how often the prober reads the engine's /metrics, s",
    )
    p.add_argument(
        "--probe-priority",
        type=int,
        default=d.probe_priority,
        help="the probes' vLLM scheduling priority (lower runs earlier: before any request)",
    )
    # Simulated engine.
    p.add_argument(
        "--profile", default="h100-llama-8b", choices=sorted(PROFILES), help="the simulated engine's profile"
    )
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="the simulated engine runs this many times faster"
    )
    p.add_argument("--fault", default="none", help="the simulated engine's injected fault (its --fault)")
    p.add_argument(
        "--fault-after", type=float, default=0.0, help="seconds before the fault starts (its --fault-after)"
    )
    p.add_argument(
        "--enable-fault-injection",
        action="store_true",
        help="the simulated engine serves /_sim/fault (tests only; else 404)",
    )
    # vLLM engine.
    launcher.add_vllm_arguments(p)
    args = p.parse_args(ours)
    try:
        args.events_key = read_key(args.events_key_file, EVENTS_KEY_VARIABLE) or ""
    except ValueError as exc:
        p.error(str(exc))
    os.environ.pop(EVENTS_KEY_VARIABLE, None)  # the prober's; the engine inherits none of it
    return args, extra


def engine_command(args: argparse.Namespace, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    if args.engine == "sim":
        if args.api_server_count != 1:
            raise SystemExit(
                f"--api-server-count {args.api_server_count}: the simulated engine is one process; "
                "the flag applies to --engine vllm"
            )
        cmd = [
            sys.executable,
            "-m",
            "dataplane.runtime.sim",
            "--port",
            str(args.port),
            "--host",
            args.host,
            "--profile",
            args.profile,
            "--time-scale",
            str(args.time_scale),
            "--fault",
            args.fault,
            "--fault-after",
            str(args.fault_after),
        ]
        if args.served_model_name:
            cmd += ["--served-model-name", args.served_model_name]
        if args.enable_fault_injection:
            cmd.append("--enable-fault-injection")
        return cmd + extra, dict(os.environ)
    spec = launcher.spec_from_args(args, args.port, args.host, extra)
    return launcher.build_command(spec), launcher.engine_env(reserved_cpus=args.reserved_cpus)


def _die_with_parent() -> None:
    """In the engine child: get SIGTERM if the pod process dies (even by SIGKILL), so that
    no engine outlives its pod and holds the port (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except OSError:
        pass  # not Linux/glibc: the supervisor's process-group kill still applies


class EngineProcess(Protocol):
    """What the pod needs of its engine process (``asyncio.subprocess.Process`` has it)."""

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def send_signal(self, sig: int, /) -> None: ...

    def kill(self) -> None: ...


# Starts the engine from its command and environment. The default spawns a new process; a warm
# pod (``warm``) hands the command to an engine interpreter it started and imported beforehand.
EngineLauncher = Callable[[list[str], dict[str, str]], Awaitable[EngineProcess]]


async def spawn_engine(cmd: list[str], env: dict[str, str]) -> EngineProcess:
    return await asyncio.create_subprocess_exec(*cmd, env=env, preexec_fn=_die_with_parent)


def parent_pid(env: Mapping[str, str]) -> int:
    """The pid of the process that started this pod, as it said (``pod_process.PARENT_VARIABLE``:
    read at the pod's start, it could already be init's); 0 when not said (a container's pod)."""
    raw = env.get(PARENT_VARIABLE, "")
    return int(raw) if raw.isdigit() else 0


async def watch_parent(stop: asyncio.Event, parent: int, interval_s: float = 1.0) -> None:
    """Drain (``stop``) once the process that started this pod is gone, at once if it is gone
    already: a cluster agent killed (SIGKILL, or after its stop's grace) leaves its pods in
    sessions of their own, which no process-group kill reaches, and the agent started again
    starts pods anew; an orphan would hold its port and a core for nothing. Not where no parent
    was said (a container's pod: the kubelet stops it)."""
    if parent <= 1:
        return
    while not stop.is_set():
        if os.getppid() != parent:
            log.error("pod: the process that started it (pid %d) is gone; draining", parent)
            stop.set()
            return
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except TimeoutError:
            pass


def record_start(state_dir: str, now_iso: str) -> dict[str, object]:
    """Count this start in ``state_dir``; returns the previous state ({} on the first)."""
    path = Path(state_dir) / "pod-state.json"
    try:
        previous = json.loads(path.read_text())
    except (OSError, ValueError):
        previous = {}
    starts = int(previous.get("starts", 0)) + 1
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"starts": starts, "last_start": now_iso}))
    tmp.replace(path)  # atomic: a crash mid-write leaves the old count
    return dict(previous)


async def run_pod(
    args: argparse.Namespace, extra: list[str], launch_engine: EngineLauncher = spawn_engine
) -> int:
    cmd, env = engine_command(args, extra)  # first: bad engine arguments exit before anything starts
    config = ProberConfig(
        idle_interval_s=args.idle_interval,
        completion_deadline_s=args.completion_deadline,
        failure_threshold=args.failure_threshold,
        startup_timeout_s=args.startup_timeout,
        scrape_interval_s=args.scrape_interval,
        probe_priority=args.probe_priority,
    )
    reporter = EventReporter(
        ReporterConfig(
            url=args.control_plane_url,
            key=args.events_key,
            endpoint=args.endpoint_id,
            pod=args.name,
            version=args.endpoint_version,
            tenant=args.tenant,
        )
    )
    if args.state_dir:
        previous = record_start(args.state_dir, utc_now_iso())
        if previous:
            starts = int(str(previous.get("starts", 0))) + 1
            reporter.report(
                "restart",
                "warning",
                f"pod {args.name} restarted (start #{starts})",
                {"starts": starts, "previous_start": previous.get("last_start")},
            )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before the spawn: a SIGTERM then still drains
        loop.add_signal_handler(sig, stop.set)
    log.info("pod %s starting engine: %s", args.name, " ".join(cmd))
    engine = await launch_engine(cmd, env)
    probe = ProbeLoop(
        config,
        args.host,
        args.port,
        reporter,
        model=args.served_model_name if args.engine == "sim" else (args.served_model_name or args.model),
        api_key=os.environ.get(engine_auth.ENV_VARIABLE, ""),  # the engine's own key, from the same env
    )
    await probe.http.start(args.host, args.probe_port)
    probe_task = asyncio.create_task(probe.run(stop))
    orphan_watch = asyncio.create_task(watch_parent(stop, parent_pid(os.environ)))
    engine_exit = asyncio.create_task(engine.wait())
    stop_wait = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({engine_exit, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if engine_exit.done():
            code = engine_exit.result()
            log.error("pod %s: engine exited with %s", args.name, code)
            return code if code else 1  # an engine that exits on its own is a failure
        log.info("pod %s: SIGTERM, draining engine for up to %.0f s", args.name, args.grace)
        engine.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(engine_exit), args.grace)
        except TimeoutError:
            log.error("pod %s: engine did not drain in %.0f s; killing", args.name, args.grace)
            engine.kill()
            await engine_exit
        return 0
    finally:
        stop.set()
        stop_wait.cancel()
        orphan_watch.cancel()
        await probe_task
        await probe.http.close()
        if engine.returncode is None:
            engine.kill()
            await engine.wait()
        await asyncio.to_thread(reporter.close, 2.0)


def main(argv: list[str] | None = None, launch_engine: EngineLauncher = spawn_engine) -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    args, extra = parse_args(list(sys.argv[1:] if argv is None else argv))
    sys.exit(asyncio.run(run_pod(args, extra, launch_engine)))


if __name__ == "__main__":
    main()
