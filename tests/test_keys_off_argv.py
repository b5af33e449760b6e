"""Keys never on a command line: every process that holds one (router, cluster agent, pods,
load generator) takes it from its environment or a file and refuses ``--key VALUE``, since a
process's arguments are readable by every user of the machine (ps, /proc/<pid>/cmdline)."""

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from controlplane.tenants.models import ApiKey
from dataplane.cluster import agent as agent_cli
from dataplane.loadgen.__main__ import parse_args as loadgen_args
from dataplane.router.__main__ import parse_args as router_args
from dataplane.runtime import pod as pod_cli
from tests.runtime.support import agent_token_file, answers, free_ports, wait_until

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("parse", "argv", "variable"),
    [
        (router_args, ["--control-plane", "http://127.0.0.1:1", "--key", "mu_secret"], "ROUTER_KEY"),
        (
            agent_cli.main,
            ["--control-plane", "http://127.0.0.1:1", "--key", "mu_secret"],
            "MU_CONTROL_PLANE_KEY",
        ),
        (
            pod_cli.parse_args,
            ["--engine", "sim", "--port", "1", "--probe-port", "2", "--events-key", "mu_secret"],
            "MU_POD_EVENTS_KEY",
        ),
        (loadgen_args, ["--model", "chat", "--key", "mu_secret"], "MU_API_KEY"),
    ],
)
def test_a_key_on_the_command_line_is_refused_saying_where_it_goes(parse, argv, variable, capsys):
    with pytest.raises(SystemExit) as exit:
        parse(argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    flag = argv[-2]
    assert f"{flag} puts the" in err and f"${variable}" in err and f"{flag}-file PATH" in err, err
    assert "mu_secret" not in err


def test_the_router_reads_its_key_from_the_file_or_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROUTER_KEY", "from-env")
    assert router_args(["--control-plane", "http://cp"]).key == "from-env"
    key_file = tmp_path / "operator.key"
    key_file.write_text("from-file\n")
    assert router_args(["--control-plane", "http://cp", "--key-file", str(key_file)]).key == "from-file"
    monkeypatch.delenv("ROUTER_KEY")
    key_file.write_text("  \n")
    with pytest.raises(SystemExit):
        router_args(["--control-plane", "http://cp", "--key-file", str(key_file)])
    assert f"the key file {key_file} is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        router_args(["--control-plane", "http://cp", "--key-file", str(tmp_path / "missing")])
    assert f"cannot read the key file {tmp_path / 'missing'}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        router_args(["--control-plane", "http://cp"])
    assert "$ROUTER_KEY or --key-file PATH" in capsys.readouterr().err


def test_the_pod_and_the_load_generator_read_theirs(tmp_path, monkeypatch):
    monkeypatch.setenv("MU_POD_EVENTS_KEY", "pod-env")
    args, _ = pod_cli.parse_args(["--engine", "sim", "--port", "1", "--probe-port", "2"])
    assert args.events_key == "pod-env"
    assert "MU_POD_EVENTS_KEY" not in os.environ  # read, and kept from the engine's environment
    (tmp_path / "k").write_text("tenant-file")
    assert loadgen_args(["--model", "chat", "--key-file", str(tmp_path / "k")]).key == "tenant-file"


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (the tree under the one we started; no scan)."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in children.read_text().split():
            found += [int(child), *descendants(int(child))]
    return found


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.stack
@pytest.mark.django_db(transaction=True)
def test_run_local_passes_the_key_to_the_agent_and_the_router_off_argv_and_to_no_pod(live_server, tmp_path):
    """The agent and the router started as scripts/run-local.sh starts them (--key-file on a
    mode-600 file): the key is in no process's arguments, and it works. An agent that has the
    operator key in its environment hands it to no pod, warm (from its pool) or cold: each pod
    (and its engine) gets its deployment's events credential instead (/proc/<pid>/environ of
    the processes under the agent this test started)."""
    _, operator = ApiKey.issue(name="local-stack", tenant=None)
    key_file = tmp_path / "operator.key"
    key_file.write_text(operator + "\n")
    key_file.chmod(0o600)
    assert "--key-file" in (ROOT / "scripts/run-local.sh").read_text()
    token_file = agent_token_file(tmp_path)
    token = Path(token_file).read_text().strip()
    agent_port, router_port = free_ports(2)
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_KEY", "MU_CONTROL_PLANE_KEY")}
    started = [
        subprocess.Popen(
            [sys.executable, "-m", "dataplane.cluster.agent", "--listen", f"127.0.0.1:{agent_port}",
             "--control-plane", live_server.url, "--token-file", token_file, "--grace", "5",
             "--warm-pool", "1"],
            # as the embedded stack's supervisor starts it: its stores' addresses and secrets too
            env={**env, "MU_CONTROL_PLANE_KEY": operator, "ROUTER_KEY": operator, **STACK_SECRETS},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "dataplane.router", "--listen", f"127.0.0.1:{router_port}",
             "--control-plane", live_server.url, "--key-file", str(key_file), "--poll-interval-s", "0.2"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
    ]  # fmt: skip
    agent, router = started
    try:
        # The router is ready once it has a routing table, which only the operator key fetches.
        wait_until(lambda: answers(f"http://127.0.0.1:{router_port}/health"), timeout=30)
        wait_until(lambda: answers(f"http://127.0.0.1:{agent_port}/healthz"), timeout=30)
        assert f"MU_CONTROL_PLANE_KEY={operator}".encode() in environ(agent.pid)  # what it could leak
        sim = ["--profile", "tiny-test", "--served-model-name", "chat"]
        declared = {"name": "ep-1", "replicas": 2, "labels": {"endpoint": "1"}, "args": sim,
                    "events_key": "mupod_1_events"}  # fmt: skip
        request = urllib.request.Request(
            f"http://127.0.0.1:{agent_port}/deployments",
            json.dumps({"deployments": [declared]}).encode(),
            {"authorization": f"Bearer {token}", "content-type": "application/json"},
            method="PUT",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
        # Two pods ready (one from the warm pool), each with its engine.
        pods_request = urllib.request.Request(
            f"http://127.0.0.1:{agent_port}/pods", headers={"authorization": f"Bearer {token}"}
        )

        def ready_pods() -> list[dict]:
            with urllib.request.urlopen(pods_request, timeout=10) as answer:
                return [p for p in json.loads(answer.read())["pods"] if p["ready"]]

        wait_until(lambda: len(ready_pods()) == 2, timeout=60)
        assert sorted(p["warm"] for p in ready_pods()) == [False, True]
        processes = descendants(agent.pid)
        for pid in [agent.pid, router.pid, *processes]:
            assert operator not in cmdline(pid), cmdline(pid)
        for pid in processes:  # pods, warm processes, engines: none has the operator key
            assert operator.encode() not in Path(f"/proc/{pid}/environ").read_bytes(), cmdline(pid)
            held = {v.partition(b"=")[0].decode() for v in environ(pid)}
            assert not held & set(STACK_SECRETS), (cmdline(pid), held & set(STACK_SECRETS))
        pods = [p for p in processes if "dataplane.runtime.pod" in cmdline(p)]
        assert pods and "--control-plane-url" in cmdline(pods[0])
        # A cold pod has its events credential where it reads it (dataplane.runtime.pod); a warm
        # one was handed it on its stdin, after it started.
        assert any(b"MU_POD_EVENTS_KEY=mupod_1_events" in environ(p) for p in pods)
    finally:
        for proc in started:
            proc.terminate()
        for proc in started:
            proc.wait(timeout=30)


# What the embedded stack exports to its processes and a pod must not hold (the agent's too).
STACK_SECRETS = {
    "SECRET_KEY": "x" * 50,
    "REDIS_URL": "unix:///nonexistent/redis.sock",
    "CLUSTER_AGENT_TOKEN_FILE": "/nonexistent/agent.token",
}


def environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def test_the_makefile_passes_no_key_on_a_command_line():
    """`make load` (the manifests: tests/test_manifests.py)."""
    makefile = (ROOT / "Makefile").read_text()
    assert "--key-file var/keys/acme.key" in makefile and '--key "' not in makefile
