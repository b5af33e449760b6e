"""Warm runtime processes: a pod and its engine interpreter, started and imported ahead of need.

    python -m dataplane.runtime.warm --engine sim [--ready-fd N] [--engine-python PY]

A cold pod start pays twice for an interpreter and its imports (the pod, then its engine) before
the engine even begins to load its model; for vLLM the imports alone (torch, vllm) take 10 s or
more. A warm process has paid already: it has imported the pod's code and started its engine's
interpreter (``--role engine``), which has imported ``dataplane.runtime.sim``, or vLLM's OpenAI
server module when vllm is installed. It then waits for one JSON line on stdin::

    {"argv": [pod arguments], "env": {"NAME": "value"}, "log": "/path/to/pod.log" or null}

and becomes that pod (``pod.main``), except that the pod hands its engine command to the waiting
engine interpreter, which runs the module with runpy as ``__main__``: what is left is the model
load. The guarantees of a cold pod hold: whoever starts a warm process gives it its own session,
so a SIGKILL of the group takes the engine too; the engine interpreter is spawned with
PR_SET_PDEATHSIG, so it gets SIGTERM when the pod dies; SIGTERM makes the pod drain its engine.
An engine command the warm interpreter cannot honour (another interpreter, an environment that
differs where imports have read it) gets a cold engine. When both interpreters have imported,
the process writes one byte to ``--ready-fd``. Stdin closed without an assignment: both exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import runpy
import selectors
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dataplane.runtime import engine_auth, launcher, pod

log = logging.getLogger("dataplane.runtime.warm")

ENGINE_KINDS = ("sim", "vllm")
# What an engine interpreter imports while it waits; for vllm it is also whatever vllm imports.
ENGINE_MODULES = {"sim": "dataplane.runtime.sim", "vllm": launcher.VLLM_MODULE}
# Read by an interpreter (and the dynamic loader) when it starts; too late to set afterwards.
INTERPRETER_ENV_PREFIXES = ("PYTHON", "LD_")
ENGINE_EXIT_WAIT_S = 5.0  # an idle engine interpreter told to exit gets this long, seconds


@dataclass(frozen=True)
class Assignment:
    """What a waiting process is told to become; one JSON line on its stdin."""

    argv: tuple[str, ...]  # arguments after ``python -m <module>``
    env: dict[str, str]  # pod: set on top of its environment; engine: its whole environment
    log: str | None = None  # file that takes over stdout and stderr; None: keep them
    module: str | None = None  # engine only: the module to run as __main__

    def encode(self) -> bytes:
        body = {"argv": list(self.argv), "env": self.env, "log": self.log, "module": self.module}
        return json.dumps(body).encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes) -> Assignment:
        body = json.loads(line)
        argv, env = body.get("argv"), body.get("env", {})
        log_path, module = body.get("log"), body.get("module")
        if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
            raise ValueError(f"argv must be a list of strings, got {argv!r}")
        if not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
            raise ValueError(f"env must map names to strings, got {env!r}")
        if not (log_path is None or isinstance(log_path, str)):
            raise ValueError(f"log must be a path or null, got {log_path!r}")
        if not (module is None or isinstance(module, str)):
            raise ValueError(f"module must be a module name or null, got {module!r}")
        return cls(tuple(argv), dict(env), log_path, module)


def engine_call(cmd: Sequence[str], python: str) -> tuple[str, tuple[str, ...]] | None:
    """(module, arguments) when ``cmd`` is ``<python> -m <module> ...``; None otherwise.

    Paths are compared as written, not resolved: two virtualenvs' pythons are symlinks to the
    same binary yet import different packages."""
    if len(cmd) < 3 or cmd[1] != "-m" or os.path.abspath(cmd[0]) != os.path.abspath(python):
        return None
    return cmd[2], tuple(cmd[3:])


def env_fits(kind: str, started: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    """Can an interpreter started with ``started`` run ``kind`` ("pod", "sim" or "vllm") as if it
    had been started with ``wanted``?

    Every interpreter reads PYTHON* and LD_* only when it starts. The pod and the simulated engine
    read the rest when they run, after the warm process has set it; vLLM's imports read much of
    it (OMP_NUM_THREADS sizes torch's pool, HF_HOME, VLLM_*), so a vllm engine needs the very
    environment it was started with."""
    keys = set(started) | set(wanted)
    if kind == "vllm":  # but its key, read when it builds its app (envs.VLLM_API_KEY), after the imports
        keys.discard(engine_auth.ENV_VARIABLE)
        return all(started.get(k) == wanted.get(k) for k in keys)
    return all(started.get(k) == wanted.get(k) for k in keys if k.startswith(INTERPRETER_ENV_PREFIXES))


def engine_startup_env(kind: str) -> dict[str, str]:
    """The environment an engine interpreter of ``kind`` starts with: what a pod with default
    arguments would give its engine (``--reserved-cpus 1`` sizes vLLM's thread pools)."""
    return launcher.engine_env(reserved_cpus=1) if kind == "vllm" else dict(os.environ)


class ReadySignal:
    """The ``--ready-fd`` pipe: one byte once imported, then closed; closed unsent when an
    assignment comes first, so that the pod does not carry it."""

    def __init__(self, fd: int | None):
        self.fd = fd

    def send(self) -> None:
        if self.fd is not None:
            try:
                os.write(self.fd, b"1")
            except OSError:
                pass  # nobody listens any more; an assignment may still come
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _take_over_stdio(log_path: str | None) -> None:
    """Stdin from /dev/null, as a cold pod's engine sees nothing there either; stdout and stderr
    to the pod's log, which the process could not know before it was assigned."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    if log_path:
        out = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)


# --- the engine interpreter ---


def run_engine(kind: str, ready: ReadySignal) -> int:
    """Import the engine's code, then run the engine command that comes on stdin."""
    try:
        importlib.import_module(ENGINE_MODULES[kind])
    except Exception as err:  # vllm not installed here, or broken: the run will import (and fail) again
        print(f"warm engine: cannot preimport {ENGINE_MODULES[kind]}: {err!r}", file=sys.stderr)
    ready.send()
    line = sys.stdin.buffer.readline()
    if not line.strip():
        return 0  # the pod left without an assignment
    call = Assignment.decode(line)
    if not call.module:
        raise SystemExit(f"warm engine: no module in the assignment: {line[:200]!r}")
    _take_over_stdio(call.log)
    os.environ.clear()
    os.environ.update(call.env)
    # As `python -m` would see it: the module not imported yet (runpy warns otherwise, and
    # the module's own code runs afresh as __main__; its imports stay warm).
    sys.modules.pop(call.module, None)
    sys.argv = [call.module, *call.argv]
    runpy.run_module(call.module, run_name="__main__", alter_sys=True)
    return 0


# --- the pod ---


class AdoptedEngine:
    """An engine started with ``subprocess`` (before the pod's event loop existed), seen as the
    pod's ``EngineProcess``; its exit is awaited through a pidfd in the loop."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def send_signal(self, sig: int, /) -> None:
        self.proc.send_signal(sig)  # a no-op once the process has been reaped

    def kill(self) -> None:
        self.proc.kill()

    async def wait(self) -> int:
        if (code := self.proc.poll()) is not None:
            return code
        try:
            pidfd = os.pidfd_open(self.proc.pid)
        except OSError:  # Linux < 5.3: a thread blocked in waitpid
            return await asyncio.to_thread(self.proc.wait)
        exited = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(pidfd, exited.set)  # readable once the process has exited
        try:
            await exited.wait()
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        return self.proc.wait()


class WarmEngine:
    """The engine interpreter a warm pod starts ahead of its assignment."""

    def __init__(self, kind: str, python: str):
        self.kind = kind
        self.python = python
        self.env = engine_startup_env(kind)  # what it was started with
        self.log: str | None = None  # the pod's log, once assigned
        ready_r, ready_w = os.pipe()
        cmd = [python, "-m", "dataplane.runtime.warm", "--role", "engine", "--engine", kind]
        try:
            self.proc = subprocess.Popen(
                [*cmd, "--ready-fd", str(ready_w)],
                stdin=subprocess.PIPE,
                env=self.env,
                pass_fds=(ready_w,),
                preexec_fn=pod._die_with_parent,  # as a cold engine: dies with the pod
            )
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            os.close(ready_w)
        self.ready_r: int | None = ready_r  # one byte once it has imported; EOF if it died first

    def close_ready(self) -> None:
        if self.ready_r is not None:
            os.close(self.ready_r)
            self.ready_r = None

    def discard(self) -> None:
        """Tell the idle interpreter to leave (stdin closed); kill it if it does not."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=ENGINE_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    async def launch(self, cmd: list[str], env: dict[str, str]) -> pod.EngineProcess:
        """The pod's engine launcher: the command runs in the waiting interpreter when it can."""
        call = engine_call(cmd, self.python)
        if call is None or not env_fits(self.kind, self.env, env) or self.proc.poll() is not None:
            log.warning("warm engine interpreter cannot run this engine; starting a cold one")
            await asyncio.to_thread(self.discard)
            return await pod.spawn_engine(cmd, env)
        module, argv = call
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(Assignment(argv, env, self.log, module).encode())
            self.proc.stdin.close()
        except OSError:  # it died since: a pipe nobody reads
            log.warning("warm engine interpreter exited with %s; starting a cold one", self.proc.poll())
            await asyncio.to_thread(self.discard)
            return await pod.spawn_engine(cmd, env)
        log.info("engine runs in the warm interpreter, pid %d", self.proc.pid)
        return AdoptedEngine(self.proc)


def wait_for_assignment(engine: WarmEngine, ready: ReadySignal) -> Assignment | None:
    """Read the assignment from stdin (None when stdin closes first), meanwhile signalling
    ``ready`` once the engine interpreter has imported. Exits 1 if that one dies first."""
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, "stdin")
    if engine.ready_r is not None:
        selector.register(engine.ready_r, selectors.EVENT_READ, "engine")
    received = b""
    try:
        while True:
            for key, _ in selector.select():
                if key.data == "engine":
                    engine_ready = os.read(key.fd, 1) == b"1"
                    selector.unregister(key.fd)
                    engine.close_ready()
                    if not engine_ready:
                        log.error("warm engine interpreter exited with %s", engine.proc.wait())
                        raise SystemExit(1)  # useless now; whoever keeps the pool starts another
                    ready.send()
                    continue
                chunk = os.read(0, 65536)
                if not chunk:
                    return None
                received += chunk
                if b"\n" in received:
                    return Assignment.decode(received.split(b"\n", 1)[0])
    finally:
        selector.close()


def run_warm_pod(kind: str, ready: ReadySignal, engine_python: str) -> int:
    engine = WarmEngine(kind, engine_python)
    try:
        assignment = wait_for_assignment(engine, ready)
    except BaseException:
        engine.close_ready()
        engine.discard()
        raise
    if assignment is None:
        engine.close_ready()
        engine.discard()
        return 0
    # An assignment before the engine had imported: nothing more to wait for or to tell.
    engine.close_ready()
    ready.close()
    engine.log = assignment.log
    _take_over_stdio(assignment.log)
    os.environ.update(assignment.env)
    log.info("warm pod assigned: %s", " ".join(assignment.argv))
    pod.main(list(assignment.argv), launch_engine=engine.launch)
    return 0  # not reached: pod.main exits with the pod's status


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dataplane.runtime.warm")
    parser.add_argument(
        "--engine", choices=ENGINE_KINDS, required=True, help="the engine this warm process preloads"
    )
    parser.add_argument(
        "--role",
        choices=("pod", "engine"),
        default="pod",
        help="pod: wait for an assignment and run the pod; engine: the pod's engine process",
    )
    parser.add_argument("--ready-fd", type=int, default=None, help="gets one byte once imported")
    parser.add_argument(
        "--engine-python", default=sys.executable, help="interpreter of the engine (vllm's, for vllm)"
    )
    args = parser.parse_args(argv)
    if args.role == "engine":  # logging as the engine itself sets it up, when it runs
        sys.exit(run_engine(args.engine, ReadySignal(args.ready_fd)))
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    sys.exit(run_warm_pod(args.engine, ReadySignal(args.ready_fd), args.engine_python))


if __name__ == "__main__":
    main()
