"""Router discovery from EndpointSlices (stand-in API server, real kubernetes client, real router
and fake pods): a terminating pod stops getting new requests before it goes, while its requests
in flight finish; the control plane's pods serve until the first list; the last slices stay in
use when the API server is away; a lost watch relists."""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys

import pytest

from dataplane.router.discovery import StaticDiscovery
from dataplane.router.endpointslices import EndpointSliceDiscovery, pods_by_endpoint, slice_pods
from dataplane.router.server import Router
from dataplane.wire.routing_table import RoutedPod, RoutingTable
from tests.cluster.kube_standin import endpoint_slice, write_kubeconfig
from tests.router.conftest import FAST, TENANT_KEY, call, free_port, table_doc, wait_until
from tests.router.fakepod import FakePod

READY = {"ready": True, "serving": True, "terminating": False}
TERMINATING = {"ready": False, "serving": True, "terminating": True}
NOT_READY = {"ready": False, "serving": False, "terminating": False}


def test_slice_conditions_decide_what_is_routed_to():
    s = endpoint_slice(
        "ep-1-abc",
        "1",
        [
            ("ep-1-a", "10.0.0.1", READY),
            ("ep-1-b", "10.0.0.2", {}),  # ready unset: the API says to read it as ready
            ("ep-1-c", "10.0.0.3", TERMINATING),
            ("ep-1-d", "10.0.0.4", NOT_READY),
            ("ep-1-e", "10.0.0.5", {"ready": True, "terminating": True}),  # publishNotReadyAddresses
            ("ep-1-f", "fd00::6", READY),
        ],
    )
    endpoint, pods = slice_pods(s)
    assert endpoint == 1
    assert [(p.name, p.ready) for p in pods] == [
        ("ep-1-a", True),
        ("ep-1-b", True),
        ("ep-1-c", False),
        ("ep-1-d", False),
        ("ep-1-e", False),
        ("ep-1-f", True),
    ]
    assert pods[0].url == "http://10.0.0.1:8000" and pods[-1].url == "http://[fd00::6]:8000"
    # The version label (copied from the Service of deployment ep-1-v2) feeds the traffic split.
    s["metadata"]["labels"]["mu/version"] = "2"
    assert {p.version for p in slice_pods(s)[1]} == {"2"}
    not_ours = endpoint_slice("kube-dns-x", "1", [])
    not_ours["metadata"]["labels"].pop("mu/endpoint")
    assert slice_pods(not_ours) == (None, [])


def test_a_pod_in_two_slices_is_ready_only_if_both_say_so():
    moving = [
        endpoint_slice("ep-1-a", "1", [("ep-1-x", "10.0.0.1", READY)]),
        endpoint_slice("ep-1-b", "1", [("ep-1-x", "10.0.0.1", TERMINATING)]),
        endpoint_slice("ep-2-a", "2", [("ep-2-x", "10.0.0.2", READY)]),
    ]
    assert pods_by_endpoint(moving) == {
        1: (RoutedPod("ep-1-x", "http://10.0.0.1:8000", False),),
        2: (RoutedPod("ep-2-x", "http://10.0.0.2:8000", True),),
    }


def pod_slice(fake: FakePod, conditions: dict) -> dict:
    """One slice per fake pod: each listens on its own port, and a slice has one port."""
    return endpoint_slice(f"ep-1-{fake.name}", "1", [(fake.name, "127.0.0.1", conditions)], port=fake.port)


def pod_named(ep, name):
    return next(p for p in ep.pods if p.name == name)


def run(coro):
    asyncio.run(asyncio.wait_for(coro, 20))


def test_a_terminating_pod_gets_no_new_requests_but_finishes_those_in_flight(standin):
    async def go():
        pods = [await FakePod(f"pod-{i}").start() for i in range(2)]
        for p in pods:
            standin.put("endpointslices", pod_slice(p, READY))
        cp = StaticDiscovery(RoutingTable.from_json(table_doc([])))  # the control plane lists no pods
        discovery = EndpointSliceDiscovery(cp, "mu-runtime", standin.api_client(), backoff_base_s=0.05)
        router = Router(FAST, seed=1)
        try:
            await router.start("127.0.0.1", 0, discovery)
            await wait_until(lambda: router.endpoints and len(router.endpoints[1].pods) == 2, what="two pods")
            ep = router.endpoints[1]
            body = {"model": "chat", "prompt": "hi"}
            seen = set()
            for _ in range(12):
                status, headers, _ = await call(router, body=body, key=TENANT_KEY)
                assert status == 200
                seen.add(headers["x-pod"])
            assert seen == {"pod-0", "pod-1"}
            # a request in flight on pod-1 when Kubernetes starts deleting it (pod-0 is briefly
            # unready so that the held request lands on pod-1)
            standin.put("endpointslices", pod_slice(pods[0], NOT_READY))
            await wait_until(lambda: not pod_named(ep, "pod-0").ready, what="pod-0 unready")
            pods[1].mode = "hold"
            before = pods[1].requests
            held = asyncio.ensure_future(call(router, body=body, key=TENANT_KEY))
            await wait_until(lambda: pods[1].requests == before + 1, what="the held request on pod-1")
            standin.put("endpointslices", pod_slice(pods[0], READY))
            standin.put("endpointslices", pod_slice(pods[1], TERMINATING))
            await wait_until(
                lambda: pod_named(ep, "pod-0").ready and not pod_named(ep, "pod-1").ready, what="the swap"
            )
            for _ in range(10):
                status, headers, _ = await call(router, body=body, key=TENANT_KEY)
                assert status == 200 and headers["x-pod"] == "pod-0"
            assert pods[1].requests == before + 1  # nothing new reached the terminating pod
            pods[1].release.set()
            status, headers, _ = await held
            assert status == 200 and headers["x-pod"] == "pod-1"  # ... and what it held finished
            # the pod is gone: its slice entry goes, the router forgets it
            standin.delete("endpointslices", "ep-1-pod-1")
            await wait_until(
                lambda: [p.name for p in router.endpoints[1].pods] == ["pod-0"], what="pod-1 gone"
            )
        finally:
            await router.shutdown(0.5)
            for p in pods:
                await p.stop()

    run(go())


def test_control_plane_pods_until_the_first_list_then_slices_and_the_last_slices_when_away(standin):
    async def go():
        pods = [await FakePod(f"pod-{i}").start() for i in range(2)]
        cp = StaticDiscovery(RoutingTable.from_json(table_doc(pods[:1])))  # the control plane: pod-0
        standin.fail("GET", "/endpointslices", 503, times=2, message="apiserver starting")
        standin.put("endpointslices", pod_slice(pods[1], READY))
        discovery = EndpointSliceDiscovery(cp, "mu-runtime", standin.api_client(), backoff_base_s=0.05)
        tables = []
        gen = discovery.snapshots()
        try:
            tables.append(await gen.__anext__())
            assert [p.name for p in tables[0].endpoints[0].pods] == ["pod-0"]  # the list failed so far
            tables.append(await gen.__anext__())
            assert [p.name for p in tables[1].endpoints[0].pods] == ["pod-1"]  # slices rule from now on
            assert discovery.reflector is not None and discovery.reflector.lists == 1
            # the API server goes away: the router keeps the last slices
            standin.fail("GET", "/endpointslices", 503, times=1000, message="down")
            standin.end_watches()
            await wait_until(lambda: discovery.reflector.failures >= 2, timeout=5, what="failed watches")
            assert [p.name for p in discovery._pods[1]] == ["pod-1"]
            # back, after a compaction: the watcher relists and sees the change it missed
            standin.faults.clear()
            standin.compact(lambda: standin.put("endpointslices", pod_slice(pods[0], READY)))
            table = await asyncio.wait_for(gen.__anext__(), 5)
            assert [p.name for p in table.endpoints[0].pods] == ["pod-0", "pod-1"]
            assert discovery.reflector.lists == 2 and standin.gone_answers == ["event"]
        finally:
            await gen.aclose()
            for p in pods:
                await p.stop()
        assert discovery.reflector._stop.is_set()  # closing the discovery stops its watch

    run(go())


@pytest.mark.stack
def test_the_router_command_line_takes_pods_from_endpointslices(standin, tmp_path):
    """`python -m dataplane.router --control-plane ... --endpointslices NS` with a kubeconfig."""
    from tests.router.test_control_plane_discovery import StandInControlPlane

    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", standin.url)

    async def go():
        pod = await FakePod("ep-1-a").start()
        cp = await StandInControlPlane().start()
        cp.doc = table_doc([])  # no pods from the control plane: they come from the slice
        standin.put("endpointslices", pod_slice(pod, READY))
        port = free_port()
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "dataplane.router", "--listen", f"127.0.0.1:{port}"),
                *("--control-plane", cp.url, "--endpointslices", "mu-runtime"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "PYTHONWARNINGS": "error",
                "KUBECONFIG": str(kubeconfig),
                "ROUTER_KEY": "op-key",
            },
        )
        try:
            from dataplane.router.upstream import fetch

            status, headers = 0, {}
            for _ in range(100):
                with contextlib.suppress(OSError):
                    body = b'{"model": "chat", "prompt": "hi"}'
                    auth = {"authorization": f"Bearer {TENANT_KEY}"}
                    status, headers, _ = await fetch(
                        f"http://127.0.0.1:{port}/v1/completions", "POST", auth, body, 2
                    )
                    if status == 200:
                        break
                await asyncio.sleep(0.1)
            assert status == 200 and headers["x-pod"] == "ep-1-a"
            assert any(r.query.get("watch") for r in standin.requests if "endpointslices" in r.path)
            assert (
                standin.requests[0].query["labelSelector"] == "app.kubernetes.io/managed-by=mu-controlplane"
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(5)
                if proc.stdout:
                    output = proc.stdout.read().decode()
                    proc.stdout.close()
            await cp.stop()
            await pod.stop()
        assert proc.returncode == 0, output

    run(go())


def test_endpointslices_need_the_control_plane(monkeypatch):
    from dataplane.router.__main__ import parse_args

    monkeypatch.setenv("ROUTER_KEY", "k")
    with pytest.raises(SystemExit):
        parse_args(["--backends", "http://127.0.0.1:9001", "--endpointslices", "mu-runtime"])
    args = parse_args(["--control-plane", "http://cp", "--endpointslices", "mu-runtime"])
    assert args.endpointslices == "mu-runtime"
