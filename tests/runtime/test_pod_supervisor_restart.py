"""End to end with simulated engines: a pod's liveness fails when its engine hangs, the
supervisor restarts it and reports the restart; a crashing pod becomes a crash loop."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from dataplane.runtime.events import EventReporter, ReporterConfig
from dataplane.runtime.pod_process import PodLaunch
from dataplane.runtime.restart_policy import RestartPolicy
from dataplane.runtime.supervisor import Supervisor, SupervisorConfig
from tests.runtime.support import EventSink, free_port, http, start_pod, stop_group, wait_until

pytestmark = pytest.mark.stack  # pods as subprocesses

# Short intervals so that a hang is found in about a second: probe after 0.3 s of silence,
# declare hung when the probe has waited 1 s. Simulated time runs 100x faster.
FAST_POD = (
    "--enable-fault-injection",  # the tests hang pods through /_sim/fault
    "--profile",
    "tiny-test",
    "--time-scale",
    "100",
    "--idle-interval",
    "0.3",
    "--completion-deadline",
    "1.0",
    "--scrape-interval",
    "0.1",
    "--grace",
    "2",
)


@pytest.fixture
def supervisor(event_sink: EventSink, tmp_path: object) -> Iterator[Supervisor]:
    reporter = EventReporter(
        ReporterConfig(url=event_sink.url, key="sup-key", backoff_base_s=0.05, backoff_cap_s=0.2)
    )
    sup = Supervisor(
        SupervisorConfig(
            check_interval_s=0.2,
            probe_timeout_s=1.0,
            stop_grace_s=3.0,
            restart_policy=RestartPolicy(
                window_s=60, crash_loop_restarts=3, backoff_base_s=0.2, backoff_cap_s=1.0
            ),
            log_dir=str(tmp_path),
        ),
        reporter,
    )
    sup.start()
    try:
        yield sup
    finally:
        sup.close()
        reporter.close()


Attribution = tuple[int | None, int | None, str]  # (endpoint, version, tenant)


def launch(name: str, *extra: str, attribution: Attribution = (None, None, "")) -> PodLaunch:
    return PodLaunch(
        name=name,
        engine="sim",
        port=free_port(),
        probe_port=free_port(),
        args=FAST_POD + extra,
        attribution=attribution,
    )


def status(sup: Supervisor, name: str) -> tuple[int | None, bool, int]:
    [pod] = [p for p in sup.list_pods() if p.name == name]
    return pod.pid, pod.ready, pod.restarts


def livez(pod: PodLaunch) -> int | None:
    try:
        return http("GET", f"http://127.0.0.1:{pod.probe_port}/livez", timeout=1)[0]
    except OSError:
        return None


def test_hung_engine_fails_liveness_and_is_restarted(supervisor: Supervisor, event_sink: EventSink) -> None:
    pod = launch("pod-hang", attribution=(7, 2, "acme"))  # the agent's, from the deployment's labels
    supervisor.start_pod(pod)
    wait_until(lambda: status(supervisor, "pod-hang")[1], timeout=15)
    first_pid = status(supervisor, "pod-hang")[0]
    assert livez(pod) == 200
    engine = f"http://127.0.0.1:{pod.port}"
    assert http("POST", engine + "/v1/completions", {"prompt": "hi", "max_tokens": 3})[0] == 200

    assert http("POST", engine + "/_sim/fault", {"mode": "hang"})[0] == 200
    hung_at = time.monotonic()
    # Detection: <= idle 0.3 s + deadline 1.0 s + scrape 0.1 s = 1.4 s after the last
    # progress; the supervisor notices within its 0.2 s check interval and restarts.
    wait_until(lambda: status(supervisor, "pod-hang")[2] == 1, timeout=10)
    assert time.monotonic() - hung_at < 1.4 + 0.2 + 2.0  # + process stop/start slack
    wait_until(lambda: status(supervisor, "pod-hang")[1], timeout=15)
    new_pid, _, restarts = status(supervisor, "pod-hang")
    assert new_pid != first_pid and restarts == 1
    assert livez(pod) == 200  # a fresh engine, no fault
    assert http("POST", engine + "/v1/completions", {"prompt": "hi", "max_tokens": 3})[0] == 200

    wait_until(lambda: "restart" in event_sink.kinds(), timeout=10)
    restart = next(e for e in event_sink.received if e.kind == "restart")
    assert restart.pod == "pod-hang" and restart.severity == "warning"
    assert (restart.endpoint, restart.version, restart.tenant) == (7, 2, "acme")  # whose pod it is
    assert "liveness failed" in restart.message
    assert event_sink.auth[0] == "Bearer sup-key"


def test_pod_reports_the_hang_itself(event_sink: EventSink) -> None:
    # The pod's prober reports "hang" to the event API, with the pod's name and endpoint.
    pod = launch("pod-self")
    proc = start_pod(
        *pod.command()[3:],
        "--control-plane-url",
        event_sink.url,
        "--endpoint-id",
        "42",
        "--endpoint-version",
        "3",
        # the key never in argv: ps shows that to every user
        env={"MU_POD_EVENTS_KEY": "pod-self-key", "MU_TENANT": "acme"},
    )
    try:
        assert livez(pod) in (None, 200)  # starting: live (or not listening yet), not ready
        readyz = f"http://127.0.0.1:{pod.probe_port}/readyz"
        wait_until(lambda: livez(pod) == 200 and http("GET", readyz)[0] == 200, timeout=15)
        assert json.loads(http("GET", readyz)[2])["ready"]
        http("POST", f"http://127.0.0.1:{pod.port}/_sim/fault", {"mode": "hang"})
        wait_until(lambda: livez(pod) == 503, timeout=5)
        assert http("GET", f"http://127.0.0.1:{pod.probe_port}/readyz")[0] == 503
        wait_until(lambda: "hang" in event_sink.kinds(), timeout=5)
        hang = event_sink.received[event_sink.kinds().index("hang")]
        assert (hang.pod, hang.endpoint, hang.severity) == ("pod-self", 42, "critical")
        assert (hang.version, hang.tenant) == (3, "acme")
        # the prober's own metrics (the PrometheusRule's hang rate reads mu_prober_hangs_total)
        from prometheus_client.parser import text_string_to_metric_families

        scrape = http("GET", f"http://127.0.0.1:{pod.probe_port}/metrics")[2].decode()
        samples = {s.name: s.value for f in text_string_to_metric_families(scrape) for s in f.samples}
        assert samples["mu_prober_hangs_total"] == 1 and samples["mu_prober_live"] == 0
        assert samples["mu_prober_probes_total"] >= 1 and samples["mu_prober_probe_failures_total"] >= 0
        assert event_sink.auth[-1] == "Bearer pod-self-key"
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0  # SIGTERM: engine drained, clean exit
        stop_group(proc)


def test_dead_engine_restarts_and_repeated_crashes_are_a_crash_loop(
    supervisor: Supervisor, event_sink: EventSink
) -> None:
    # The engine crashes 0.5 s after every start: the pod exits, the supervisor restarts it;
    # the third restart within the window is a crash loop, reported once, and backed off.
    supervisor.start_pod(launch("pod-crash", "--fault", "crash", "--fault-after", "0.5"))
    wait_until(lambda: "crash_loop" in event_sink.kinds(), timeout=30)
    restarts = [e for e in event_sink.received if e.kind == "restart"]
    assert len(restarts) >= 3
    assert "exited" in restarts[0].message
    loop = event_sink.received[event_sink.kinds().index("crash_loop")]
    assert loop.severity == "critical" and loop.detail["delay_s"] > 0
    assert status(supervisor, "pod-crash")[2] >= 3


def test_stop_pod_terminates_pod_and_engine(supervisor: Supervisor) -> None:
    pod = launch("pod-stop")
    supervisor.start_pod(pod)
    wait_until(lambda: status(supervisor, "pod-stop")[1], timeout=15)
    assert supervisor.stop_pod("pod-stop", grace_s=5) == 0
    assert supervisor.list_pods() == []
    with pytest.raises(OSError):
        http("GET", f"http://127.0.0.1:{pod.port}/health", timeout=1)  # engine gone too


def test_pod_with_a_state_dir_reports_its_own_restart(event_sink: EventSink, tmp_path: object) -> None:
    # As in Kubernetes, where an emptyDir outlives the container: the second start of the
    # pod with the same state dir reports a restart; the first does not.
    pod = launch("pod-k8s")
    args = [*pod.command()[3:], "--control-plane-url", event_sink.url, "--state-dir", str(tmp_path)]
    for start in (1, 2):
        proc = start_pod(*args)
        try:
            wait_until(lambda: livez(pod) == 200, timeout=15)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            stop_group(proc)
        if start == 1:  # the pod flushes its events before it exits
            assert "restart" not in event_sink.kinds()
    wait_until(lambda: "restart" in event_sink.kinds(), timeout=5)
    event = event_sink.received[event_sink.kinds().index("restart")]
    assert event.pod == "pod-k8s" and event.detail["starts"] == 2


def test_engine_dies_with_its_pod_even_on_sigkill() -> None:
    pod = launch("pod-orphan")
    proc = start_pod(*pod.command()[3:])
    engine_health = f"http://127.0.0.1:{pod.port}/health"

    def engine_up() -> bool:
        try:
            return http("GET", engine_health, timeout=1)[0] == 200
        except OSError:
            return False

    try:
        wait_until(engine_up, timeout=15)
        proc.kill()  # the pod alone, not its process group
        proc.wait(timeout=10)
        wait_until(lambda: not engine_up(), timeout=10)  # the engine got SIGTERM and left
    finally:
        stop_group(proc)
