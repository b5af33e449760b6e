"""The local cluster agent gives its pods the fleet key in their environment, a warm pool's
pods too: each real simulated pod then answers only requests bearing it."""

import pytest

from dataplane.cluster.agent import Agent
from dataplane.cluster.driver import Deployment
from dataplane.runtime.supervisor import Supervisor, SupervisorConfig
from dataplane.runtime.warm_pool import WarmPoolConfig
from tests.runtime.support import http, wait_until

pytestmark = pytest.mark.stack  # the agent's pods (and warm processes) as subprocesses

SIM = ("--profile", "tiny-test", "--time-scale", "20", "--served-model-name", "chat")
KEY = "the-fleet-key"


@pytest.mark.parametrize("warm", [0, 1])
def test_the_agents_pods_answer_only_the_fleet_key(warm):
    supervisor = Supervisor(
        SupervisorConfig(check_interval_s=0.2, stop_grace_s=5, warm_pool=WarmPoolConfig(size=warm))
    )
    agent = Agent(supervisor, drain_delay_s=0.5, pod_key=KEY)
    supervisor.start()
    try:
        if warm:
            wait_until(lambda: any(w.ready for w in supervisor.warm_pool.waiting()), timeout=30)
        agent.apply([Deployment("ep-1", 1, "sim", SIM)])

        def ready():
            agent.reconcile_once()
            return any(p.ready for p in agent.pods())

        wait_until(ready, timeout=30)
        (pod,) = agent.pods()
        assert pod.warm == bool(warm)
        body = {"model": "chat", "prompt": "hi", "max_tokens": 2}
        assert http("POST", pod.url + "/v1/completions", body)[0] == 401
        wrong = {"authorization": "Bearer nope"}
        assert http("POST", pod.url + "/v1/completions", body, headers=wrong)[0] == 401
        status, _, answer = http(
            "POST", pod.url + "/v1/completions", body, headers={"authorization": f"Bearer {KEY}"}
        )
        assert status == 200, answer
    finally:
        agent.close()
