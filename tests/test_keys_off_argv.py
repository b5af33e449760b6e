"""Keys never on a command line: every process that holds one (router, cluster agent, pods,
load generator) takes it from its environment or a file and refuses ``--key VALUE``, since a
process's arguments are readable by every user of the machine (ps, /proc/<pid>/cmdline)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.tenants.models import ApiKey
from dataplane.cluster import agent as agent_cli
from dataplane.loadgen.__main__ import parse_args as loadgen_args
from dataplane.router.__main__ import parse_args as router_args
from dataplane.runtime import pod as pod_cli
from tests.runtime.support import answers, free_ports, http, wait_until

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
            ["--engine", "sim", "--port", "1", "--probe-port", "2", "--control-plane-key", "mu_secret"],
            "MU_CONTROL_PLANE_KEY",
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
    monkeypatch.setenv("MU_CONTROL_PLANE_KEY", "pod-env")
    args, _ = pod_cli.parse_args(["--engine", "sim", "--port", "1", "--probe-port", "2"])
    assert args.control_plane_key == "pod-env"
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


@pytest.mark.django_db(transaction=True)
def test_run_local_passes_the_key_to_the_agent_its_pods_and_the_router_off_argv(live_server, tmp_path):
    """The agent and the router started as scripts/run-local.sh starts them (--key-file on a
    mode-600 file): the key is in no process's arguments, and it works."""
    _, operator = ApiKey.issue(name="local-stack", tenant=None)
    key_file = tmp_path / "operator.key"
    key_file.write_text(operator + "\n")
    key_file.chmod(0o600)
    assert "--key-file" in (ROOT / "scripts/run-local.sh").read_text()
    agent_port, router_port = free_ports(2)
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_KEY", "MU_CONTROL_PLANE_KEY")}
    started = [
        subprocess.Popen(
            [sys.executable, "-m", "dataplane.cluster.agent", "--listen", f"127.0.0.1:{agent_port}",
             "--control-plane", live_server.url, "--key-file", str(key_file), "--grace", "5"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
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
        sim = ["--profile", "tiny-test", "--served-model-name", "chat"]
        body = {"deployments": [{"name": "ep-1", "replicas": 1, "labels": {"endpoint": "1"}, "args": sim}]}
        assert http("PUT", f"http://127.0.0.1:{agent_port}/deployments", body)[0] == 200
        wait_until(lambda: len(descendants(agent.pid)) >= 2, timeout=30)  # the pod and its engine
        pods = descendants(agent.pid)
        for pid in [agent.pid, router.pid, *pods]:
            assert operator not in cmdline(pid), cmdline(pid)
        pod = next(p for p in pods if "dataplane.runtime.pod" in cmdline(p))
        assert "--control-plane-url" in cmdline(pod)
        # ... and the pod has it where it reads it (dataplane.runtime.pod: $MU_CONTROL_PLANE_KEY).
        environ = Path(f"/proc/{pod}/environ").read_bytes().split(b"\0")
        assert f"MU_CONTROL_PLANE_KEY={operator}".encode() in environ
    finally:
        for proc in started:
            proc.terminate()
        for proc in started:
            proc.wait(timeout=30)


def test_the_makefile_passes_no_key_on_a_command_line():
    """`make load` (the manifests: tests/test_manifests.py)."""
    makefile = (ROOT / "Makefile").read_text()
    assert "--key-file var/keys/acme.key" in makefile and '--key "' not in makefile
