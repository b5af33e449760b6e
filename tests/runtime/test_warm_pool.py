"""The supervisor's warm pool, with real processes on 127.0.0.1: a pod started from it serves and
is ready, the pool is refilled, its engine dies with it, and no warm process outlives close()."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator

import pytest

from dataplane.runtime.pod_process import PodLaunch
from dataplane.runtime.restart_policy import RestartPolicy
from dataplane.runtime.supervisor import PodStatus, Supervisor, SupervisorConfig
from dataplane.runtime.warm_pool import WarmPoolConfig
from tests.runtime.support import child_pids, free_port, http, pid_alive, wait_until

pytestmark = pytest.mark.stack  # pods and warm processes as subprocesses

# Readiness follows the engine within 50 ms (the prober scrapes every 0.05 s), so that the
# start is not hidden in the default 1 s scrape period. Simulated time runs 100x faster.
FAST_POD = ("--profile", "tiny-test", "--time-scale", "100", "--scrape-interval", "0.05", "--grace", "2")


def make_supervisor(tmp_path: object, warm_pool: int) -> Supervisor:
    return Supervisor(
        SupervisorConfig(
            check_interval_s=0.2,
            probe_timeout_s=1.0,
            stop_grace_s=3.0,
            log_dir=str(tmp_path),
            warm_pool=WarmPoolConfig(size=warm_pool),
        )
    )


@pytest.fixture
def supervisor(tmp_path: object) -> Iterator[Supervisor]:
    """One warm process; no background thread, so nothing restarts or refills behind a test's back."""
    sup = make_supervisor(tmp_path, warm_pool=1)
    try:
        yield sup
    finally:
        sup.close()


def launch(name: str, *env: tuple[str, str]) -> PodLaunch:
    return PodLaunch(
        name=name, engine="sim", port=free_port(), probe_port=free_port(), args=FAST_POD, env=env
    )


def pod_status(sup: Supervisor, name: str) -> PodStatus:
    [pod] = [p for p in sup.list_pods() if p.name == name]
    return pod


def warm_ready(sup: Supervisor, count: int) -> bool:
    warm = sup.warm_pool.waiting()
    return len(warm) == count and all(w.ready for w in warm)


def engine_up(port: int) -> bool:
    try:
        return http("GET", f"http://127.0.0.1:{port}/health", timeout=1)[0] == 200
    except OSError:
        return False


def test_pod_from_the_warm_pool_serves_and_the_pool_is_refilled(tmp_path: object) -> None:
    sup = make_supervisor(tmp_path, warm_pool=1)
    sup.start()
    try:
        wait_until(lambda: warm_ready(sup, 1), timeout=20)
        [warm] = sup.warm_pool.waiting()
        pod = launch("pod-warm")
        sup.start_pod(pod)
        assert pod_status(sup, "pod-warm").pid == warm.pid  # the warm process became the pod
        wait_until(lambda: pod_status(sup, "pod-warm").ready_after_s is not None, timeout=15)
        status = pod_status(sup, "pod-warm")
        assert status.warm and status.ready and status.ready_after_s is not None
        completion = {"prompt": "hi", "max_tokens": 3}
        assert http("POST", f"http://127.0.0.1:{pod.port}/v1/completions", completion)[0] == 200

        # The next check pass starts a new warm process in its place.
        wait_until(lambda: warm_ready(sup, 1) and sup.warm_pool.waiting()[0].pid != warm.pid, timeout=20)

        # SIGTERM drains the warm pod's engine as it would a cold one's: a clean exit.
        assert sup.stop_pod("pod-warm", grace_s=5) == 0
        assert not engine_up(pod.port)
    finally:
        sup.close()


def test_a_launch_the_pool_cannot_honour_starts_cold(supervisor: Supervisor) -> None:
    # PYTHONHASHSEED is read when an interpreter starts: too late for a warm one.
    supervisor.warm_pool.refill()
    wait_until(lambda: warm_ready(supervisor, 1), timeout=20)
    supervisor.start_pod(launch("pod-cold", ("PYTHONHASHSEED", "7")))
    wait_until(lambda: pod_status(supervisor, "pod-cold").ready_after_s is not None, timeout=15)
    assert not pod_status(supervisor, "pod-cold").warm
    assert len(supervisor.warm_pool.waiting()) == 1  # still there for the next pod


@pytest.mark.parametrize(
    "kill",
    [
        pytest.param(lambda pid: os.killpg(pid, signal.SIGKILL), id="the-pods-group"),
        # the pod alone, not its group: the engine gets SIGTERM (PR_SET_PDEATHSIG)
        pytest.param(lambda pid: os.kill(pid, signal.SIGKILL), id="the-pod-alone"),
    ],
)
def test_a_sigkilled_warm_pod_leaves_no_engine(supervisor: Supervisor, kill: Callable[[int], None]) -> None:
    supervisor.warm_pool.refill()
    wait_until(lambda: warm_ready(supervisor, 1), timeout=20)
    pod = launch("pod-kill")
    supervisor.start_pod(pod)
    wait_until(lambda: engine_up(pod.port), timeout=15)
    pid = pod_status(supervisor, "pod-kill").pid
    assert pid is not None
    [engine] = child_pids(pid)
    kill(pid)
    wait_until(lambda: not pid_alive(engine), timeout=10)
    assert not engine_up(pod.port)


def test_close_leaves_no_warm_process(tmp_path: object) -> None:
    sup = make_supervisor(tmp_path, warm_pool=2)
    try:
        sup.warm_pool.refill()
        wait_until(lambda: warm_ready(sup, 2), timeout=20)
        pids = [w.pid for w in sup.warm_pool.waiting()]
        engines = [engine for pid in pids for engine in child_pids(pid)]
        assert len(engines) == 2  # each has its engine interpreter waiting
    finally:
        sup.close()
    assert sup.warm_pool.waiting() == []
    assert not [pid for pid in pids + engines if pid_alive(pid)]
    sup.warm_pool.refill()  # a check pass racing close() starts nothing
    assert sup.warm_pool.waiting() == []


def test_a_pool_that_cannot_start_backs_off(tmp_path: object) -> None:
    # Its engine interpreter does not exist: each warm process exits at once. After the first
    # death the pool waits 10 s of the (fake) clock before it starts another.
    now = [1000.0]
    sup = Supervisor(
        SupervisorConfig(
            log_dir=str(tmp_path),
            warm_pool=WarmPoolConfig(size=1, engine_python=str(tmp_path) + "/no-such-python"),
            restart_policy=RestartPolicy(crash_loop_restarts=1, backoff_base_s=10.0),
        ),
        clock=lambda: now[0],
    )
    try:
        sup.warm_pool.refill()
        [first] = sup.warm_pool.waiting()
        wait_until(lambda: sup.warm_pool.waiting() == [], timeout=20)  # it died
        sup.warm_pool.refill()  # notes the death, starts nothing
        wait_until(lambda: not pid_alive(first.pid), timeout=5)
        sup.warm_pool.refill()
        assert sup.warm_pool.waiting() == []
        now[0] += 10.0
        sup.warm_pool.refill()
        [second] = sup.warm_pool.waiting()
        assert second.pid != first.pid
    finally:
        sup.close()
