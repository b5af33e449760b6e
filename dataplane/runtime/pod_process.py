"""A runtime pod as a local process: what to run for it, how it starts and how it is killed.

``PodLaunch`` is the ``python -m dataplane.runtime.pod`` command line of one pod. A pod's process,
or a warm process that will become one, starts in a session of its own with its output appended
to ``<log_dir>/<name>.log``, and is killed with its whole process group, so that no engine is
left behind. The supervisor starts pods this way, and its warm pool the processes that become pods.
Neither inherits the keys of whoever started them (``pod_environment``): a pod runs what a
deployment declared, and holds only the credentials its launch gives it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass

# What may be in the environment of the process that starts pods (the cluster agent, a test) and
# never reaches a pod: the operator key (the agent's own events; a router's), a tenant's key of
# the load generator, a stray events credential (each pod gets its own), the fleet key's file
# and variables (a pod gets the key alone, as VLLM_API_KEY, from its launch), and the control
# plane's own secrets and stores (the embedded stack exports them to all its processes).
WITHHELD_VARIABLES = frozenset(
    {
        "MU_CONTROL_PLANE_KEY",
        "ROUTER_KEY",
        "MU_API_KEY",
        "MU_POD_EVENTS_KEY",
        "MU_POD_KEY",
        "ROUTER_POD_KEY",
        "POD_KEY_FILE",
        "CLUSTER_AGENT_TOKEN_FILE",
        "SECRET_KEY",
        "DATABASE_URL",
        "REDIS_URL",
        "CELERY_BROKER_URL",
    }
)


@dataclass(frozen=True)
class PodLaunch:
    """What to run for one pod."""

    name: str  # unique pod name
    engine: str  # "sim" or "vllm"
    port: int  # engine port
    probe_port: int  # prober's /livez, /readyz port
    args: tuple[str, ...] = ()  # further `python -m dataplane.runtime.pod` arguments
    env: tuple[tuple[str, str], ...] = ()  # extra environment variables
    host: str = "127.0.0.1"  # listen address
    # whose pod it is, on the events the supervisor reports about it: (endpoint, version, tenant)
    attribution: tuple[int | None, int | None, str] = (None, None, "")

    def command(self) -> list[str]:
        return [sys.executable, "-m", "dataplane.runtime.pod", *self.pod_args()]

    def pod_args(self) -> list[str]:
        """The arguments after ``python -m dataplane.runtime.pod``."""
        return [
            "--engine",
            self.engine,
            "--port",
            str(self.port),
            "--probe-port",
            str(self.probe_port),
            "--host",
            self.host,
            "--name",
            self.name,
            *self.args,
        ]


# The pid of the process that started a pod (dataplane.runtime.pod drains once it is gone).
PARENT_VARIABLE = "MU_POD_PARENT_PID"


def pod_environment(extra: Iterable[tuple[str, str]] = ()) -> dict[str, str]:
    """This process's environment without ``WITHHELD_VARIABLES``, then ``extra`` on top, and
    this process's pid as the pod's parent: what a pod, or a warm process that will become one,
    starts with."""
    env = {k: v for k, v in os.environ.items() if k not in WITHHELD_VARIABLES}
    env.update(extra)
    env[PARENT_VARIABLE] = str(os.getpid())
    return env


def log_path(log_dir: str | None, name: str) -> str | None:
    """Where the process ``name`` writes its stdout and stderr; None: it inherits ours."""
    if not log_dir:
        return None
    os.makedirs(log_dir, mode=0o700, exist_ok=True)
    return os.path.join(log_dir, f"{name}.log")


def start_in_own_session(
    cmd: list[str],
    env: dict[str, str],
    log_path: str | None,
    stdin: int | None = None,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen[bytes]:
    # A pod's log holds what its engine printed (prompts in errors): its user's alone, whatever
    # the umask of whoever started the agent.
    out = (
        os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
        if log_path
        else None
    )
    try:
        # A new session makes the pod the leader of a process group that holds its
        # engine too, so a SIGKILL of the group leaves no orphaned engine behind.
        return subprocess.Popen(
            cmd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
            stdin=stdin,
            pass_fds=pass_fds,
        )
    finally:
        if out is not None:
            out.close()


def kill_group(pid: int) -> None:
    """SIGKILL the process group that ``pid`` leads, if it is still there."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
