"""Over real sockets: a pod started by the real launcher with the fleet key in its environment
answers only requests bearing it (vLLM's 401 ``{"error": "Unauthorized"}`` otherwise), its own
prober and the router bear it (the router in place of the tenant's key), and the fault switch
exists only in a pod started with the test flag."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataplane.runtime import engine_auth
from dataplane.runtime.launcher import VllmSpec
from tests.runtime.support import (
    free_ports,
    http,
    metric_value,
    router_process,
    start_pod,
    stop_group,
    wait_until,
)

pytestmark = pytest.mark.stack  # pods and routers as subprocesses

KEY = "fleet-key-for-the-test"
COMPLETION = {"model": "sim-tiny", "prompt": "hello", "max_tokens": 2}


def keyed_pod(*extra: str, key: str = KEY) -> Iterator[tuple[str, str]]:
    port, probe_port = free_ports(2)
    proc = start_pod(
        "--engine",
        "sim",
        "--port",
        str(port),
        "--probe-port",
        str(probe_port),
        "--name",
        "keyed",
        "--profile",
        "tiny-test",
        "--time-scale",
        "100",
        "--idle-interval",
        "0.2",
        "--scrape-interval",
        "0.1",
        *extra,
        env={engine_auth.ENV_VARIABLE: key},
    )
    engine, probe = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{probe_port}"
    try:

        def ready() -> bool:
            try:
                return http("GET", probe + "/readyz", timeout=1)[0] == 200
            except OSError:
                return False

        wait_until(ready, timeout=15)
        yield engine, probe
    finally:
        stop_group(proc)


@pytest.fixture(scope="module")
def pod() -> Iterator[tuple[str, str]]:
    yield from keyed_pod()


def test_a_pod_answers_only_the_fleet_key(pod: tuple[str, str]) -> None:
    engine, _ = pod
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}, {"x-api-key": KEY}):
        status, _, body = http("POST", engine + "/v1/completions", COMPLETION, headers=headers)
        assert (status, json.loads(body)) == (401, {"error": "Unauthorized"}), headers
    for path in ("/v1/models", "/tokenize"):  # every path but the public probes, as vLLM's guard
        assert http("GET" if path == "/v1/models" else "POST", engine + path, {"prompt": "x"})[0] == 401
    status, _, body = http(
        "POST", engine + "/v1/completions", COMPLETION, headers={"authorization": f"Bearer {KEY}"}
    )
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] == 2
    # health and metrics stay open: the kubelet and Prometheus bear no key
    assert http("GET", engine + "/health")[0] == 200
    assert http("GET", engine + "/metrics")[0] == 200


def test_the_pods_own_prober_bears_the_key(pod: tuple[str, str]) -> None:
    _, probe = pod
    # idle for 0.2 s at a time: the prober probes with a completion, which must be answered
    wait_until(lambda: metric_value(probe, "mu_prober_probes_total") >= 3, timeout=15)
    assert metric_value(probe, "mu_prober_probe_failures_total") == 0
    assert http("GET", probe + "/livez")[0] == 200


def test_the_fault_switch_is_absent_without_the_test_flag(pod: tuple[str, str]) -> None:
    engine, _ = pod
    auth = {"authorization": f"Bearer {KEY}"}
    assert http("POST", engine + "/_sim/fault", {"mode": "hang"}, headers=auth)[0] == 404
    assert http("GET", engine + "/_sim/fault", headers=auth)[0] == 404
    assert http("POST", engine + "/_sim/fault", {"mode": "hang"})[0] == 401  # and keyed like the rest
    status, _, _ = http("POST", engine + "/v1/completions", COMPLETION, headers=auth)
    assert status == 200  # not hung


def test_the_fault_switch_with_the_test_flag() -> None:
    for engine, _ in keyed_pod("--enable-fault-injection"):
        auth = {"authorization": f"Bearer {KEY}"}
        status, _, body = http("POST", engine + "/_sim/fault", {"mode": "slow", "factor": 2}, headers=auth)
        assert (status, json.loads(body)["mode"]) == (200, "slow")


def test_the_fleet_key_never_goes_on_vllms_command_line() -> None:
    for spelling in ("--api-key", "--api-key=k", "--api_key", "--api-ke"):
        with pytest.raises(ValueError, match="fleet key on the command line"):
            VllmSpec(model="/m", extra_args=(spelling, "k"))
    VllmSpec(model="/m", extra_args=("--gpu-memory-utilization", "0.9"))  # others pass


def key_file(folder: Path, key: str = KEY, mode: int = 0o600) -> Path:
    path = folder / "fleet.key"
    path.write_text(key + "\n")
    path.chmod(mode)
    return path


def test_the_router_sends_the_fleet_key_in_place_of_the_tenants(pod: tuple[str, str], tmp_path: Path) -> None:
    engine, _ = pod
    with router_process("--backends", engine, "--pod-key-file", str(key_file(tmp_path))) as router:
        for stream in (False, True):
            status, _, body = http(
                "POST",
                router + "/v1/completions",
                {**COMPLETION, "stream": stream},
                headers={"authorization": "Bearer the-tenants-own-key"},
            )
            assert status == 200, body
    # the same request straight to the pod, with the tenant's key: refused
    status, _, _ = http(
        "POST",
        engine + "/v1/completions",
        COMPLETION,
        headers={"authorization": "Bearer the-tenants-own-key"},
    )
    assert status == 401


def test_a_router_without_the_fleet_key_is_refused_by_keyed_pods(pod: tuple[str, str]) -> None:
    # The pod's 401 refuses the router, not the tenant: a 502 of the platform's, not the pod's 401
    engine, _ = pod
    with router_process("--backends", engine) as router:
        for stream in (False, True):
            status, _, body = http("POST", router + "/v1/completions", {**COMPLETION, "stream": stream})
            assert status == 502, body
            assert json.loads(body)["error"]["message"] == "a pod refused the router's credential"


@pytest.mark.parametrize(
    ("args", "mode", "said"),
    [
        (("--pod-key", KEY), 0o600, "--pod-key puts the fleet key"),
        (("--pod-key-file", "{file}"), 0o644, "is readable by group or others (mode 0644): chmod 600"),
        (("--pod-key-file", "{file}"), 0o600, "cannot carry"),  # a space
        (("--pod-key-file", "{file}"), 0o600, "holds 3 keys: at most two"),
    ],
)
def test_the_routers_fleet_key_flags(tmp_path: Path, args: tuple[str, str], mode: int, said: str) -> None:
    content = {"cannot carry": "two words", "holds 3 keys: at most two": "a\nb\nc"}.get(said, KEY)
    path = key_file(tmp_path, content, mode)
    argv = [a.format(file=path) for a in args]
    done = subprocess.run(
        [sys.executable, "-m", "dataplane.router", "--backends", "http://127.0.0.1:9", *argv],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert said in done.stderr


def test_a_rotation_serves_every_request(tmp_path: Path) -> None:
    """Rotating the fleet key: the routers' file holds the new key, then the old one; the router
    sends the new key and, to a pod still on the old one (its 401), the old: nothing fails
    while pods roll over. With the new key alone, a pod on the old one refuses it (a 502)."""
    rotating = key_file(tmp_path, "new-key\nold-key")
    (tmp_path / "new").mkdir()
    new_only = key_file(tmp_path / "new", "new-key")
    for old_pod, _ in keyed_pod(key="old-key"):
        for new_pod, _ in keyed_pod(key="new-key"):
            for backend in (old_pod, new_pod):
                with router_process("--backends", backend, "--pod-key-file", str(rotating)) as router:
                    for stream in (False, True, False):  # the last on a kept-alive connection
                        status, _, body = http(
                            "POST", router + "/v1/completions", {**COMPLETION, "stream": stream}
                        )
                        assert status == 200, body
        with router_process("--backends", old_pod, "--pod-key-file", str(new_only)) as router:
            status, _, body = http("POST", router + "/v1/completions", COMPLETION)
            assert status == 502, body
