"""Warm vs cold pod starts: seconds from ``Supervisor.start_pod`` to the pod's first /readyz 200.

    python bench/warm_start.py [--pods 5] [--smoke]
    python bench/warm_start.py --engine vllm --vllm-python .venv-vllm/bin/python [--pods 2]

Starts ``--pods`` pods one at a time with no warm pool (cold: the pod's interpreter starts and
imports, then its engine's), then ``--pods`` more from a warm pool of that size whose processes
have all finished importing before the first start (warm: only the engine's own start is left).
Each pod is stopped once ready, before the next starts, and the pool is not refilled meanwhile,
so no start competes with another process for the CPUs. Prints the median and max of each and
the ratio, with the load average. The figure is the supervisor's own ``PodStatus.ready_after_s``.

The pods scrape their engine every 0.01 s (``--scrape-interval``) and the supervisor polls their
/readyz as often, so that each figure is within about 20 ms: with the default 1 s scrape the
prober would round every start up to its next scrape and hide the difference. The simulated
engine has no model to load; with ``--engine vllm`` a tiny random Llama is made first (as in
tests/runtime/test_vllm_real.py) and both kinds of start load it, so the difference is what
importing torch and vllm costs. --smoke: one start of each kind, in seconds: does it still run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dataplane.runtime.pod_process import PodLaunch  # noqa: E402
from dataplane.runtime.supervisor import Supervisor, SupervisorConfig  # noqa: E402
from dataplane.runtime.warm_pool import WarmPoolConfig  # noqa: E402
from tests.runtime.support import free_port, make_tiny_vllm, tiny_vllm_args  # noqa: E402

SIM_ARGS = ("--profile", "tiny-test", "--time-scale", "100")
PROBE_ARGS = ("--scrape-interval", "0.01", "--grace", "5")


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.02)


def start_times(
    pods: int,
    warm: bool,
    engine: str,
    args: tuple[str, ...],
    log_dir: str,
    engine_python: str | None,
    timeout_s: float,
) -> list[float]:
    """Seconds to ready of ``pods`` pods started one after another, cold or from a warm pool."""
    sup = Supervisor(
        SupervisorConfig(
            stop_grace_s=10.0,
            ready_poll_interval_s=0.01,
            log_dir=log_dir,
            warm_pool=WarmPoolConfig(size=pods if warm else 0, engine=engine, engine_python=engine_python),
        )
    )
    times: list[float] = []
    try:
        if warm:
            sup.warm_pool.refill()  # no thread: nothing refills while pods start
            wait_for(
                lambda: sum(w.ready for w in sup.warm_pool.waiting()) == pods,
                timeout_s,
                f"{pods} warm processes imported",
            )
        for i in range(pods):
            name = f"{'warm' if warm else 'cold'}-{i}"
            sup.start_pod(
                PodLaunch(name=name, engine=engine, port=free_port(), probe_port=free_port(), args=args)
            )

            def started(name: str = name) -> bool:
                [status] = [p for p in sup.list_pods() if p.name == name]
                if not status.running:
                    raise SystemExit(f"pod {name} exited; see {log_dir}/{name}.log")
                return status.ready_after_s is not None

            wait_for(started, timeout_s, f"pod {name} ready")
            [status] = [p for p in sup.list_pods() if p.name == name]
            assert status.warm == warm and status.ready_after_s is not None, status
            times.append(status.ready_after_s)
            sup.stop_pod(name)
    finally:
        sup.close()
    return times


def summary(label: str, times: list[float]) -> str:
    each = " ".join(f"{t:.3f}" for t in times)
    return f"{label}: median {statistics.median(times):.3f} s, max {max(times):.3f} s  ({each})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=5, help="starts of each kind")
    parser.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--vllm-python", default=sys.executable, help="interpreter with vllm (--engine vllm)")
    parser.add_argument("--timeout", type=float, default=300.0, help="bound on each wait, seconds")
    parser.add_argument("--log-dir", default=None, help="keep the pods' logs here (default: discarded)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: one start of each kind")
    opts = parser.parse_args()
    if opts.smoke:  # again, with these as the defaults (an explicit argument still wins)
        parser.set_defaults(pods=1, timeout=60.0)
        opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="warm-start-") as tmp:
        log_dir = opts.log_dir or tmp
        args: tuple[str, ...] = SIM_ARGS
        engine_python = None
        if opts.engine == "vllm":
            model, tiny_env = make_tiny_vllm(Path(tmp), opts.vllm_python)
            # Set here, not per pod: a warm vLLM interpreter has imported with this environment.
            tiny_env.pop("TMPDIR")
            os.environ.update({**tiny_env, "PYTHONPATH": str(ROOT)})  # the vllm venv imports our warm module
            args = ("--vllm-python", opts.vllm_python, *tiny_vllm_args(model, max_num_seqs=2))
            args += ("--completion-deadline", "60")
            engine_python = opts.vllm_python
        args += PROBE_ARGS
        load_before = os.getloadavg()
        cold = start_times(opts.pods, False, opts.engine, args, log_dir, engine_python, opts.timeout)
        warm = start_times(opts.pods, True, opts.engine, args, log_dir, engine_python, opts.timeout)
        load_after = os.getloadavg()
    print(f"{opts.engine} pods, {opts.pods} starts each, one at a time, {os.cpu_count()} CPUs")
    print(summary("cold", cold))
    print(summary("warm", warm))
    print(
        f"cold/warm: median {statistics.median(cold) / statistics.median(warm):.1f}x, "
        f"max {max(cold) / max(warm):.1f}x"
    )
    print(
        "load average (1, 5, 15 min): before "
        + " ".join(f"{x:.2f}" for x in load_before)
        + ", after "
        + " ".join(f"{x:.2f}" for x in load_after)
    )


if __name__ == "__main__":
    main()
