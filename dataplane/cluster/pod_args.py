"""Which arguments a declared deployment may give its pods: an allowlist, no I/O.

A deployment's ``args`` go to ``python -m dataplane.runtime.pod`` (before ``--``) and on to
vLLM (after it). Whoever declares a deployment chooses what the model serves and how, never
what runs or where it reports: the interpreter (``--vllm-python``), a file the pod reads or
writes, the control plane's URL and the endpoint, version and tenant that the agent stamps on
pods' events (from the deployment's labels) are the agent's own. So every flag must be on the
list below; anything else is refused, naming it, abbreviations included (argparse and vLLM take
an unambiguous prefix: ``--vllm-p`` is ``--vllm-python``). A token that does not start with "-"
is a value; a negative number is a value too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

ENGINES = ("sim", "vllm")

# The pod's own flags a deployment may carry, each with whether it takes a value
# (dataplane.runtime.pod.parse_args and dataplane.runtime.launcher.add_vllm_arguments).
POD_FLAGS: dict[str, bool] = {
    # the simulated engine
    "--profile": True,
    "--time-scale": True,
    "--fault": True,
    "--fault-after": True,
    # the prober
    "--idle-interval": True,
    "--completion-deadline": True,
    "--failure-threshold": True,
    "--startup-timeout": True,
    "--scrape-interval": True,
    "--probe-priority": True,
    "--grace": True,
    # what the engine serves (both engines name it; vLLM's further flags)
    "--served-model-name": True,
    "--model": True,
    "--dtype": True,
    "--quantization": True,
    "--kv-cache-dtype": True,
    "--max-model-len": True,
    "--max-num-seqs": True,
    "--api-server-count": True,
    "--reserved-cpus": True,
    "--enforce-eager": False,
}

# vLLM's own flags (after "--") that tune how it serves; none names code or a file to load
# (vLLM's --tool-parser-plugin, --middleware, --chat-template, --trust-remote-code do).
VLLM_FLAGS = frozenset(
    {
        "--tensor-parallel-size",
        "-tp",
        "--pipeline-parallel-size",
        "-pp",
        "--data-parallel-size",
        "-dp",
        "--enable-expert-parallel",
        "--gpu-memory-utilization",
        "--max-model-len",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--block-size",
        "--swap-space",
        "--cpu-offload-gb",
        "--kv-cache-dtype",
        "--dtype",
        "--quantization",
        "--seed",
        "--max-logprobs",
        "--enforce-eager",
        "--max-seq-len-to-capture",
        "--long-prefill-token-threshold",
        "--max-num-partial-prefills",
        "--limit-mm-per-prompt",
        "--shutdown-timeout",
        "--disable-log-stats",
        "--disable-log-requests",
        "--enable-log-requests",
        "--disable-uvicorn-access-log",
        "--uvicorn-log-level",
    }
)

_NUMBER = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?")


def check(engine: str, args: Sequence[str]) -> None:
    """Raises ValueError naming the first engine or argument a deployment may not carry."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} must be one of {', '.join(map(repr, ENGINES))}")
    vllm_part = False
    for i, arg in enumerate(args):
        if arg == "--" and not vllm_part:
            if engine != "vllm":
                raise ValueError(f"args[{i}] '--': vLLM's own arguments are for the vllm engine only")
            vllm_part = True
            continue
        if not arg.startswith("-") or _NUMBER.fullmatch(arg):
            continue  # a value
        name, eq, _ = arg.partition("=")
        if vllm_part:
            if name.replace("_", "-") not in VLLM_FLAGS:  # vLLM reads underscores as dashes
                raise ValueError(f"args[{i}] {name!r}: not a vLLM argument a deployment may carry")
            continue
        takes_value = POD_FLAGS.get(name)
        if takes_value is None:
            raise ValueError(f"args[{i}] {name!r}: not an argument a deployment may carry")
        if eq and not takes_value:
            raise ValueError(f"args[{i}] {arg!r}: {name} takes no value")


def with_own(args: Sequence[str], own: Sequence[str]) -> tuple[str, ...]:
    """A deployment's ``args`` with the agent's ``own`` pod flags (control plane, endpoint,
    interpreter) among the pod's: before vLLM's part ("--"), never passed on to vLLM, and last
    among the pod's, so that theirs are what argparse keeps."""
    cut = args.index("--") if "--" in args else len(args)
    return (*args[:cut], *own, *args[cut:])
