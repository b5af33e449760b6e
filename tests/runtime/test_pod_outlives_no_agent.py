"""A pod whose agent is killed drains and exits: the agent starts pods in sessions of their own
(no process-group kill of the agent reaches them), and an agent started again starts new ones."""

import os
import signal
import subprocess
import sys

import pytest

from dataplane.runtime.pod_process import PARENT_VARIABLE
from tests.runtime.support import (
    answers,
    child_pids,
    free_ports,
    pid_alive,
    start_pod,
    stop_group,
    wait_until,
)

pytestmark = pytest.mark.stack  # an agent and pods as subprocesses

# Stands for the cluster agent: starts one pod as it does (its own session, its environment),
# prints its pid, waits.
AGENT = """
import subprocess, sys
from dataplane.runtime.pod_process import pod_environment, start_in_own_session
pod = start_in_own_session([sys.executable, "-m", "dataplane.runtime.pod", *sys.argv[1:]],
                           pod_environment(), None, stdin=subprocess.DEVNULL)
print(pod.pid, flush=True)
pod.wait()
"""


def test_a_pod_whose_agent_is_killed_drains_and_exits():
    port, probe_port = free_ports(2)
    pod_args = ["--engine", "sim", "--port", str(port), "--probe-port", str(probe_port),
                "--name", "orphan-1", "--profile", "tiny-test", "--served-model-name", "chat",
                "--grace", "2"]  # fmt: skip
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, *pod_args], stdout=subprocess.PIPE, start_new_session=True
    )
    with agent.stdout:  # type: ignore[union-attr]
        pod = int(agent.stdout.readline())  # type: ignore[union-attr]
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{probe_port}/readyz"), timeout=30)
        engine = child_pids(pod)
        assert engine
        os.killpg(agent.pid, signal.SIGKILL)  # the agent's group: not the pod's session
        agent.wait(timeout=10)
        wait_until(lambda: not pid_alive(pod) and not any(map(pid_alive, engine)), timeout=15)
        assert not answers(f"http://127.0.0.1:{port}/health")
    finally:
        if pid_alive(pod):
            os.killpg(pod, signal.SIGKILL)


def test_a_pod_started_after_its_agent_died_drains_at_once():
    """The agent gone before the pod's interpreter even ran: the pid it said is not the pod's
    parent (here the test is), and the pod exits without serving."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    port, probe_port = free_ports(2)
    pod = start_pod(
        "--engine", "sim", "--port", str(port), "--probe-port", str(probe_port), "--name", "orphan-2",
        "--profile", "tiny-test", "--served-model-name", "chat", "--grace", "2",
        env={PARENT_VARIABLE: str(gone.pid)},
    )  # fmt: skip
    try:
        assert pod.wait(timeout=30) == 0
    finally:
        stop_group(pod)
