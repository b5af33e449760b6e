"""The local cluster agent: its reconcile plan (pure), and the real agent running real simulated
pods behind the local driver, on 127.0.0.1."""

import asyncio
import json
import threading
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from dataplane.cluster.agent import Agent, Replica, launch_spec, plan
from dataplane.cluster.driver import ClusterError, Deployment
from dataplane.cluster.local import LocalDriver
from dataplane.runtime.http_server import HttpServer
from dataplane.runtime.supervisor import Supervisor, SupervisorConfig
from dataplane.runtime.warm_pool import WarmPoolConfig
from tests.runtime.support import agent_token_file, free_port, http, wait_until

SIM = ("--profile", "tiny-test", "--time-scale", "20", "--served-model-name", "chat")


def replica(name, deployment="ep-1", started_at=0.0, retiring=None, spec=None):
    """A replica of `deployment` as declared in the plan tests (its launch spec), unless `spec`."""
    return Replica(
        name,
        deployment,
        1,
        2,
        started_at,
        retiring_since=retiring,
        spec=spec or launch_spec(Deployment(deployment, 1)),
    )


def call(method, url, body=None, token=None):
    """(status, body) of one call to the agent (a JSON body, or bytes as they are), with
    `Authorization: Bearer token` when given."""
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data, headers, method=method), timeout=10
        ) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.read()


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


def test_plan_rolls_pods_whose_launch_spec_changed_surge_then_retire():
    """A deployment redeclared with other arguments: new pods start at once, and an old pod goes
    for each new one ready, so the deployment never has fewer ready pods than it asked."""
    old = Deployment("ep-1", 2, "sim", ("--profile", "a"))
    new = Deployment("ep-1", 2, "sim", ("--profile", "b"))
    assert launch_spec(old) != launch_spec(new)
    assert launch_spec(new) == launch_spec(Deployment("ep-1", 5, "sim", ("--profile", "b"), 9))  # no restart
    was = launch_spec(old)
    pods = [replica("ep-1-1", started_at=1.0, spec=was), replica("ep-1-2", started_at=2.0, spec=was)]
    deployments = {"ep-1": new}
    assert plan(deployments, pods, ready={"ep-1-1", "ep-1-2"}) == ({"ep-1": 2}, [])  # surge
    pods += [
        replica("ep-1-3", started_at=3.0, spec=launch_spec(new)),
        replica("ep-1-4", started_at=4.0, spec=launch_spec(new)),
    ]
    assert plan(deployments, pods, ready={"ep-1-1", "ep-1-2"}) == ({}, [])  # the old serve meanwhile
    # One new ready: one old goes, the newest; both new ready: the other old goes too.
    assert plan(deployments, pods, ready={"ep-1-1", "ep-1-2", "ep-1-3"}) == ({}, ["ep-1-2"])
    # An old pod that is not ready goes before a ready one.
    assert plan(deployments, pods, ready={"ep-1-2", "ep-1-3"}) == ({}, ["ep-1-1"])
    pods[1].retiring_since = 5.0  # the agent retired ep-1-2
    assert plan(deployments, pods, ready={"ep-1-1", "ep-1-3", "ep-1-4"}) == ({}, ["ep-1-1"])
    pods[1].retiring_since = None  # scaled to zero: all pods go, the old ones at once
    assert plan({"ep-1": replace(new, replicas=0)}, pods, ready=set()) == (
        {},
        ["ep-1-4", "ep-1-3", "ep-1-2", "ep-1-1"],
    )
    # The events credential is part of what a pod starts with: a new one rolls the pods too.
    assert launch_spec(replace(new, events_key="mupod_1_x")) != launch_spec(new)


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
    token_file = agent_token_file(request.getfixturevalue("tmp_path"))
    a = Agent(supervisor, drain_delay_s=0.5, token=Path(token_file).read_text().strip())
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
    yield a, f"http://127.0.0.1:{port}", token_file
    stop.set()
    worker.join(timeout=5)
    asyncio.run_coroutine_threadsafe(server.close(), loop).result(timeout=5)
    loop.call_soon_threadsafe(loop.stop)
    serving.join(timeout=5)
    loop.close()
    a.close()
    assert supervisor.list_pods() == [] and supervisor.warm_pool.waiting() == []


@pytest.mark.stack
def test_the_local_driver_scales_real_pods_up_and_down(agent):
    a, url, token_file = agent
    driver = LocalDriver(url, token_file)
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
    token = Path(token_file).read_text().strip()
    assert call("GET", url + "/deployments", token=token)[1].count(b'"target_concurrency": 6') == 1
    driver.apply([])  # undeclared: removed
    wait_until(lambda: not driver.list_pods(), timeout=15)


@pytest.mark.stack
@pytest.mark.parametrize("agent", [1], indirect=True)
def test_with_a_warm_pool_a_new_replica_starts_from_a_pre_started_process(agent):
    a, url, token_file = agent
    wait_until(lambda: any(w.ready for w in a.supervisor.warm_pool.waiting()), timeout=30)
    driver = LocalDriver(url, token_file)
    driver.apply([Deployment("ep-1", 1, "sim", SIM)])
    wait_until(lambda: any(p.ready for p in driver.list_pods()), timeout=30)
    (pod,) = driver.list_pods()
    assert pod.warm and pod.ready_after_s is not None
    wait_until(lambda: len(a.supervisor.warm_pool.waiting()) == 1, timeout=30)  # the pool is refilled


def test_the_agent_refuses_bad_requests_with_the_reason(agent):
    _, url, token_file = agent
    token = Path(token_file).read_text().strip()
    driver = LocalDriver(url, token_file)
    with pytest.raises(ClusterError, match=r"404 .*no deployment 'ep-7'"):
        driver.scale("ep-7", 1)
    status, body = call(
        "PUT", url + "/deployments", {"deployments": [{"name": "ep-1", "replicas": "two"}]}, token
    )
    assert status == 400 and b"replicas='two'" in body
    status, body = call("PATCH", url + "/deployments/ep-1", {"image": "x"}, token)
    assert status == 400 and b"only replicas and target_concurrency" in body
    with pytest.raises(ClusterError, match="unreachable"):
        LocalDriver(f"http://127.0.0.1:{free_port()}", token_file, timeout_s=1).list_pods()


def test_every_call_but_healthz_needs_the_token(agent):
    """Through real sockets: without the token, or with a wrong one, nothing is read, declared,
    patched or listed (401); /healthz answers and says nothing more."""
    a, url, token_file = agent
    token = Path(token_file).read_text().strip()
    declared = {"deployments": [{"name": "ep-1", "replicas": 0, "args": list(SIM)}]}
    calls = [
        ("GET", "/deployments", None),
        ("PUT", "/deployments", declared),
        ("PATCH", "/deployments/ep-1", {"replicas": 1}),
        ("GET", "/pods", None),
    ]
    for bad in (None, "", "not-the-token", token + "x", token[:-1]):
        for method, path, body in calls:
            status, answer = call(method, url + path, body, bad)
            assert status == 401 and b"Authorization: Bearer" in answer, (bad, method, path, status)
    assert a.deployments == {}  # the PUT above declared nothing
    assert call("GET", url + "/healthz") == (200, b'{"status": "ok"}')
    # With it: the same calls work.
    assert call("PUT", url + "/deployments", declared, token)[0] == 200
    assert call("PATCH", url + "/deployments/ep-1", {"replicas": 0}, token)[0] == 200
    assert json.loads(call("GET", url + "/deployments", token=token)[1])["deployments"][0]["name"] == "ep-1"
    assert call("GET", url + "/pods", token=token) == (200, b'{"pods": []}')


def test_the_token_file_must_be_the_owners_alone(tmp_path, capsys):
    """The agent refuses a token file that group or others can read; the local driver too."""
    from dataplane.cluster import agent as agent_cli

    token_file = Path(agent_token_file(tmp_path))
    token_file.chmod(0o640)
    with pytest.raises(SystemExit):
        agent_cli.main(["--token-file", str(token_file)])
    assert (
        f"the token file {token_file} is readable by group or others (mode 0640)" in capsys.readouterr().err
    )
    with pytest.raises(ClusterError, match="readable by group or others"):
        LocalDriver("http://127.0.0.1:1", str(token_file)).list_pods()
    with pytest.raises(SystemExit):
        agent_cli.main([])
    assert "--token-file" in capsys.readouterr().err
    with pytest.raises(ClusterError, match="CLUSTER_AGENT_TOKEN_FILE"):
        LocalDriver("http://127.0.0.1:1", "").list_pods()


@pytest.mark.parametrize(
    ("engine", "args", "named"),
    [
        ("vllm", ["--model", "m", "--vllm-python", "./evil.sh"], "'--vllm-python'"),
        ("vllm", ["--model", "m", "--vllm-python=./evil.sh"], "'--vllm-python'"),
        ("vllm", ["--model", "m", "--vllm-p", "./evil.sh"], "'--vllm-p'"),  # argparse's abbreviation
        ("sim", ["--control-plane-url", "http://evil"], "'--control-plane-url'"),
        ("sim", ["--endpoint-id", "9"], "'--endpoint-id'"),
        ("sim", ["--endpoint-version", "9"], "'--endpoint-version'"),
        ("sim", ["--tenant", "other"], "'--tenant'"),
        ("sim", ["--engine", "vllm"], "'--engine'"),
        ("sim", ["--state-dir", "/etc"], "'--state-dir'"),
        ("sim", ["--events-key-file", "/etc/shadow"], "'--events-key-file'"),
        ("sim", ["--port", "22"], "'--port'"),
        ("sim", ["--profile", "tiny-test", "-h"], "'-h'"),
        ("sim", ["--", "--anything"], "vllm engine only"),
        ("vllm", ["--model", "m", "--", "--tool-parser-plugin", "/tmp/evil.py"], "'--tool-parser-plugin'"),
        ("vllm", ["--model", "m", "--", "--trust-remote-code"], "'--trust-remote-code'"),
        ("vllm", ["--model", "m", "--enforce-eager=yes"], "takes no value"),
        ("gpu", [], "engine='gpu'"),
    ],
)
def test_args_that_change_what_runs_are_refused_naming_them(agent, engine, args, named):
    a, url, token_file = agent
    token = Path(token_file).read_text().strip()
    body = {"deployments": [{"name": "ep-1", "replicas": 1, "engine": engine, "args": args}]}
    status, answer = call("PUT", url + "/deployments", body, token)
    assert status == 400 and named in json.loads(answer)["error"], answer
    assert a.deployments == {}


def test_what_the_control_plane_declares_is_allowed():
    from controlplane.endpoints.deployments import vllm_args

    for engine, args in [
        ("sim", (*SIM, "--fault", "none", "--fault-after", "-1", "--grace", "5", "--idle-interval", "0.5")),
        (
            "vllm",
            vllm_args("m", 2, "chat", ("--max-num-seqs", "64", "--", "--gpu-memory-utilization", "0.9")),
        ),
        ("vllm", vllm_args("m", 1, "chat", ("--api-server-count", "2", "--enforce-eager"))),
        ("vllm", ("--model", "m", "--", "--max_model_len=8K", "-tp", "2", "--enable-prefix-caching")),
    ]:
        d = Deployment.from_json({"name": "ep-1", "replicas": 1, "engine": engine, "args": list(args)})
        assert d.args == tuple(args)


def test_the_events_credential_reaches_the_agent_and_no_answer_shows_it():
    d = Deployment("ep-1", 1, "sim", SIM, 1, {"endpoint": "1"}, "mupod_1_secret")
    assert "mupod_1_secret" not in repr(d) and "events_key" not in d.to_json()
    assert Deployment.from_json(d.to_json(with_secrets=True)).events_key == "mupod_1_secret"


@pytest.mark.stack
def test_a_redeclared_deployment_rolls_its_pods_keeping_one_ready(agent):
    """Real pods: a deployment redeclared with another served name gets new pods, and its old pod
    goes only once a new one is ready; at no point has it no ready pod."""
    _a, url, token_file = agent
    driver = LocalDriver(url, token_file)
    driver.apply([Deployment("ep-1", 1, "sim", SIM, 4, {"endpoint": "1"})])
    wait_until(lambda: any(p.ready for p in driver.list_pods()), timeout=30)
    (first,) = driver.list_pods()
    renamed = (*SIM[:-1], "chat-2")
    driver.apply([Deployment("ep-1", 1, "sim", renamed, 4, {"endpoint": "1"})])
    seen: set[str] = set()

    def rolled() -> bool:
        pods = driver.list_pods()
        seen.update(p.name for p in pods)
        assert any(p.ready for p in pods), pods  # never none ready
        return [p.name for p in pods] != [first.name] and len(pods) == 1 and pods[0].ready

    wait_until(rolled, timeout=30)
    assert seen - {first.name}  # a new pod started...
    (pod,) = driver.list_pods()
    body = {"model": "chat-2", "prompt": "hi", "max_tokens": 2}
    assert http("POST", pod.url + "/v1/completions", body)[0] == 200  # ...serving the new arguments
    driver.apply([])
    wait_until(lambda: not driver.list_pods(), timeout=15)


def test_the_agent_refuses_any_nesting_depth_and_serves_on(agent):
    _, url, token_file = agent
    token = Path(token_file).read_text().strip()
    for body in (b"[" * 100_000, b'{"deployments": ' + b"[" * 200 + b"]" * 200 + b"}"):
        status, answer = call("PUT", url + "/deployments", body, token)
        assert status == 400 and b"nested deeper than 128 levels" in answer, (status, answer[:200])
    status, answer = call("PATCH", url + "/deployments/ep-1", b'{"replicas": ' + b"[" * 100_000, token)
    assert status == 400 and b"nested deeper than 128 levels" in answer
    assert call("GET", url + "/deployments", token=token)[0] == 200


@pytest.mark.stack
def test_a_vllm_pod_gets_the_agents_own_arguments_and_vllm_only_its_own(tmp_path):
    """A vLLM deployment's args end with vLLM's own after "--" (``vllm_args`` always puts one):
    the agent's arguments (its interpreter, the control plane, the endpoint) are the pod's, so
    they go before it, never on to vLLM (which refuses what it does not know), and the pod runs
    vLLM with the agent's interpreter. A real pod process; the interpreter a script that writes
    down how it was called."""
    from controlplane.endpoints.deployments import vllm_args
    from dataplane.cluster.agent import control_plane_args

    called = tmp_path / "called"
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {called}.part && mv {called}.part {called}\nexec sleep 30\n'
    )
    python.chmod(0o700)
    supervisor = Supervisor(SupervisorConfig(check_interval_s=0.2, stop_grace_s=2))
    a = Agent(supervisor, pod_args=control_plane_args(f"http://127.0.0.1:{free_port()}", str(python)))
    supervisor.start()
    try:
        args = vllm_args("m", 1, "chat", ("--max-num-seqs", "8", "--", "--gpu-memory-utilization", "0.5"))
        labels = {"endpoint": "7", "version": "2", "tenant": "acme"}
        a.apply([Deployment("ep-7-v2", 1, "vllm", args, 8, labels, "mupod_7_x")])
        a.reconcile_once()
        wait_until(called.exists, timeout=30)
        argv = called.read_text().split("\n")
        assert argv[:2] == ["-m", "vllm.entrypoints.openai.api_server"], argv
        after = argv[argv.index("--max-num-seqs") :]
        assert "--control-plane-url" not in argv and "--vllm-python" not in argv, argv
        assert "--gpu-memory-utilization" in after and "--tensor-parallel-size" in after, argv
    finally:
        a.close()
