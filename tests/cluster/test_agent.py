"""The local cluster agent: its reconcile plan (pure), and the real agent running real simulated
pods behind the local driver, on 127.0.0.1."""

import asyncio
import threading

import pytest

from dataplane.cluster.agent import Agent, Replica, plan
from dataplane.cluster.driver import ClusterError, Deployment
from dataplane.cluster.local import LocalDriver
from dataplane.runtime.http_server import HttpServer
from dataplane.runtime.supervisor import Supervisor, SupervisorConfig
from dataplane.runtime.warm_pool import WarmPoolConfig
from tests.runtime.support import free_port, http, wait_until

SIM = ("--profile", "tiny-test", "--time-scale", "20", "--served-model-name", "chat")


def replica(name, deployment="ep-1", started_at=0.0, retiring=None):
    return Replica(name, deployment, 1, 2, started_at, retiring_since=retiring)


def test_plan_starts_the_missing_and_retires_unready_then_newest():
    deployments = {"ep-1": Deployment("ep-1", 2), "ep-2": Deployment("ep-2", 3)}
    pods = [
        replica("ep-1-1", started_at=1.0),
        replica("ep-1-2", started_at=2.0),
        replica("ep-1-3", started_at=3.0),
        replica("ep-1-4", started_at=4.0),
        replica("ep-2-5", "ep-2"),
        replica("ep-2-6", "ep-2", retiring=9.0),  # already going: does not count as serving
        replica("ep-9-7", "ep-9"),  # its deployment was removed
    ]
    # ep-1 has 4 for 2: the not-ready ep-1-2 goes first, then the newest ready one, ep-1-4.
    start, retire = plan(deployments, pods, ready={"ep-1-1", "ep-1-3", "ep-1-4", "ep-2-5"})
    assert start == {"ep-2": 2}
    assert sorted(retire) == ["ep-1-2", "ep-1-4", "ep-9-7"]


def test_deployments_refuse_bad_fields_naming_them():
    with pytest.raises(ValueError, match=r"replicas=-1"):
        Deployment.from_json({"name": "ep-1", "replicas": -1})
    with pytest.raises(ValueError, match=r"engine='gpu'"):
        Deployment.from_json({"name": "ep-1", "replicas": 1, "engine": "gpu"})
    with pytest.raises(ValueError, match=r"target_concurrency=0"):
        Deployment.from_json({"name": "ep-1", "replicas": 1, "target_concurrency": 0})


@pytest.fixture
def agent(request):
    """A real agent: its HTTP API on a loop thread, its reconcile loop on another."""
    warm = getattr(request, "param", 0)
    supervisor = Supervisor(
        SupervisorConfig(check_interval_s=0.2, stop_grace_s=5, warm_pool=WarmPoolConfig(size=warm))
    )
    a = Agent(supervisor, drain_delay_s=0.5)
    supervisor.start()
    loop = asyncio.new_event_loop()
    server = HttpServer(a.handle)
    port = free_port()
    loop.run_until_complete(server.start("127.0.0.1", port))
    serving = threading.Thread(target=loop.run_forever, daemon=True)
    serving.start()
    stop = threading.Event()

    def reconcile():
        while not stop.wait(0.1):
            a.reconcile_once()

    worker = threading.Thread(target=reconcile, daemon=True)
    worker.start()
    yield a, f"http://127.0.0.1:{port}"
    stop.set()
    worker.join(timeout=5)
    asyncio.run_coroutine_threadsafe(server.close(), loop).result(timeout=5)
    loop.call_soon_threadsafe(loop.stop)
    serving.join(timeout=5)
    loop.close()
    a.close()
    assert supervisor.list_pods() == [] and supervisor.warm_pool.waiting() == []


def test_the_local_driver_scales_real_pods_up_and_down(agent):
    a, url = agent
    driver = LocalDriver(url)
    driver.apply([Deployment("ep-1", 2, "sim", SIM, 4, {"endpoint": "1"})])
    # Ready, with the start-to-ready time the supervisor's ready poll records (its own thread).
    wait_until(lambda: sum(bool(p.ready and p.ready_after_s) for p in driver.list_pods()) == 2, timeout=30)
    pods = driver.list_pods()
    assert {p.deployment for p in pods} == {"ep-1"}
    status, _, body = http(
        "POST", pods[0].url + "/v1/completions", {"model": "chat", "prompt": "hi", "max_tokens": 2}
    )
    assert status == 200, body

    driver.scale("ep-1", 1)
    # The retired pod reports not ready at once (routers stop sending), and goes after the delay.
    wait_until(lambda: sum(p.ready for p in driver.list_pods()) == 1, timeout=5)
    wait_until(lambda: len(driver.list_pods()) == 1, timeout=15)
    # The agent stops listing a pod when it stops it; the supervisor forgets it once it exits.
    wait_until(lambda: len(a.supervisor.list_pods()) == 1, timeout=15)

    driver.set_target_concurrency("ep-1", 6)
    assert http("GET", url + "/deployments")[2].count(b'"target_concurrency": 6') == 1
    driver.apply([])  # undeclared: removed
    wait_until(lambda: not driver.list_pods(), timeout=15)


@pytest.mark.parametrize("agent", [1], indirect=True)
def test_with_a_warm_pool_a_new_replica_starts_from_a_pre_started_process(agent):
    a, url = agent
    wait_until(lambda: any(w.ready for w in a.supervisor.warm_pool.waiting()), timeout=30)
    driver = LocalDriver(url)
    driver.apply([Deployment("ep-1", 1, "sim", SIM)])
    wait_until(lambda: any(p.ready for p in driver.list_pods()), timeout=30)
    (pod,) = driver.list_pods()
    assert pod.warm and pod.ready_after_s is not None
    wait_until(lambda: len(a.supervisor.warm_pool.waiting()) == 1, timeout=30)  # the pool is refilled


def test_the_agent_refuses_bad_requests_with_the_reason(agent):
    _, url = agent
    driver = LocalDriver(url)
    with pytest.raises(ClusterError, match=r"404 .*no deployment 'ep-7'"):
        driver.scale("ep-7", 1)
    status, _, body = http(
        "PUT", url + "/deployments", {"deployments": [{"name": "ep-1", "replicas": "two"}]}
    )
    assert status == 400 and b"replicas='two'" in body
    status, _, body = http("PATCH", url + "/deployments/ep-1", {"image": "x"})
    assert status == 400 and b"only replicas and target_concurrency" in body
    with pytest.raises(ClusterError, match="unreachable"):
        LocalDriver(f"http://127.0.0.1:{free_port()}", timeout_s=1).list_pods()


def test_the_agent_refuses_any_nesting_depth_and_serves_on(agent):
    _, url = agent
    for body in (b"[" * 100_000, b'{"deployments": ' + b"[" * 200 + b"]" * 200 + b"}"):
        status, _, answer = http("PUT", url + "/deployments", body)
        assert status == 400 and b"nested deeper than 128 levels" in answer, (status, answer[:200])
    status, _, answer = http("PATCH", url + "/deployments/ep-1", b'{"replicas": ' + b"[" * 100_000)
    assert status == 400 and b"nested deeper than 128 levels" in answer
    assert http("GET", url + "/deployments")[0] == 200
