"""The pod watcher (and the list-then-watch reflector under it) against the stand-in API server:
restarts and crash loops become events, a lost watch (410 Gone) relists and still reports what
changed while it was gone, bookmarks advance the resourceVersion, an unreachable API server is
waited out."""

import threading
import time

import pytest

from dataplane.cluster.kubernetes import PodWatcher
from dataplane.cluster.kubewatch import Reflector
from tests.cluster.kube_standin import pod


def wait_for(predicate, timeout=5.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def watching(standin):
    """Start a watcher over whatever pods exist; yields (watcher, events); stops it after."""
    started = []

    def start():
        events = []
        watcher = PodWatcher("mu-runtime", events.append, standin.api_client(), backoff_base_s=0.05)
        thread = threading.Thread(target=watcher.run, daemon=True)
        thread.start()
        started.append((watcher, thread))
        standin.wait_for_watches(1)
        return watcher, events

    yield start
    for watcher, thread in started:
        watcher.stop()
        thread.join(5)
        assert not thread.is_alive()


def test_restarts_and_crash_loops_become_events_but_history_at_start_up_does_not(standin, watching):
    standin.put("pods", pod("ep-1-a", restarts=5))  # restarted before the watcher started
    standin.put("pods", pod("ep-1-b"))
    watcher, events = watching()
    standin.put("pods", pod("ep-1-a", restarts=6, terminated={"reason": "OOMKilled", "exitCode": 137}))
    wait_for(lambda: len(events) == 1)
    assert events[0].kind == "restart" and events[0].pod == "ep-1-a" and "OOMKilled" in events[0].message
    standin.put("pods", pod("ep-1-b", restarts=1, waiting="CrashLoopBackOff"))
    wait_for(lambda: len(events) == 3)
    assert [(e.kind, e.pod) for e in events[1:]] == [("restart", "ep-1-b"), ("crash_loop", "ep-1-b")]
    standin.put("pods", pod("ep-1-b", restarts=1, waiting="CrashLoopBackOff", ready=False))  # no news
    standin.put("pods", pod("ep-1-c", restarts=1))  # a new pod that already restarted once
    wait_for(lambda: len(events) == 4)
    assert (events[3].kind, events[3].pod) == ("restart", "ep-1-c")
    time.sleep(0.1)
    assert len(events) == 4 and watcher.reflector.lists == 1


@pytest.mark.parametrize("how", ["event", "status"])
def test_a_watch_lost_to_410_relists_and_misses_no_event(standin, watching, how):
    standin.put("pods", pod("ep-1-a", restarts=0))
    watcher, events = watching()
    first_version = watcher.reflector.resource_version

    def while_away():
        standin.put("pods", pod("ep-1-a", restarts=1, terminated={"reason": "Error", "exitCode": 1}))
        standin.put("pods", pod("ep-1-new", restarts=2, waiting="CrashLoopBackOff"))

    # the watch ends, the pods change, and history is compacted before the watcher comes back:
    # its resourceVersion is gone (410 as an ERROR event, or as the status), so it must relist
    standin.compact(while_away, how=how)
    wait_for(lambda: watcher.reflector.lists == 2, what="a relist")
    assert standin.gone_answers == [how]
    wait_for(lambda: len(events) == 3)
    assert sorted((e.kind, e.pod) for e in events) == [
        ("crash_loop", "ep-1-new"),
        ("restart", "ep-1-a"),
        ("restart", "ep-1-new"),
    ]
    assert int(watcher.reflector.resource_version) > int(first_version)
    # and it watches again from the relist's resourceVersion
    standin.wait_for_watches(1)
    standin.put("pods", pod("ep-1-a", restarts=2))
    wait_for(lambda: len(events) == 4)


def test_bookmarks_advance_the_resource_version_so_a_quiet_watch_survives_compaction(standin, watching):
    standin.put("pods", pod("ep-1-a"))
    watcher, _ = watching()
    # other objects change (not pods we select): our watch sees nothing, etcd's revision moves on
    for i in range(3):
        standin.put("pods", {"metadata": {"name": f"other-{i}", "labels": {"app": "other"}}})
    standin.bookmark()
    wait_for(lambda: watcher.reflector.bookmarks == 1)
    assert watcher.reflector.resource_version == str(standin.rv)
    standin.compact()  # history before now is gone; the bookmark's resourceVersion is not
    wait_for(lambda: len(standin.watches) == 2, what="the watch to resume")
    standin.wait_for_watches(1)
    assert watcher.reflector.lists == 1 and standin.gone_answers == []  # resumed from the bookmark


def test_without_bookmarks_the_same_compaction_costs_a_relist(standin, watching):
    standin.put("pods", pod("ep-1-a"))
    watcher, _ = watching()
    for i in range(3):
        standin.put("pods", {"metadata": {"name": f"other-{i}", "labels": {"app": "other"}}})
    standin.compact()
    wait_for(lambda: watcher.reflector.lists == 2, what="a relist")
    assert standin.gone_answers == ["event"]


def test_an_api_server_error_is_waited_out_and_the_watch_resumes(standin, watching):
    standin.put("pods", pod("ep-1-a"))
    watcher, events = watching()
    standin.fail("GET", "/pods", 500, times=3, message="etcd leader changed")
    standin.end_watches()
    wait_for(lambda: standin.faults[0].times == 0, what="three failed watches")
    standin.wait_for_watches(1)
    assert watcher.reflector.failures == 3  # backed off three times, now watching again
    standin.put("pods", pod("ep-1-a", restarts=1))
    wait_for(lambda: len(events) == 1)
    assert watcher.reflector.lists == 1  # resumed from its resourceVersion, nothing relisted


def test_a_failing_sink_does_not_stop_the_watch(standin):
    seen = []

    def sink(event):
        seen.append(event)
        raise RuntimeError("database down")

    standin.put("pods", pod("ep-1-a"))
    watcher = PodWatcher("mu-runtime", sink, standin.api_client())
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        standin.wait_for_watches(1)
        standin.put("pods", pod("ep-1-a", restarts=1))
        standin.put("pods", pod("ep-1-a", restarts=2))
        wait_for(lambda: len(seen) == 2)
    finally:
        watcher.stop()
        thread.join(5)


def test_a_stop_that_races_the_watch_request_is_not_lost():
    """stop() arrives while the watch request is on its way (before its response is known to the
    reflector): run() must still return instead of blocking on a stream nobody will end."""

    class Endless:  # a watch stream the server never ends
        def stream(self, **_):
            threading.Event().wait(30)
            yield b""

        def release_conn(self):
            pass

    class Listed:
        data = b'{"metadata": {"resourceVersion": "1"}, "items": []}'

        def release_conn(self):
            pass

    def list_pods(namespace, watch=False, **_):
        if not watch:
            return Listed()
        reflector.stop()  # the race: stop() sees no response yet
        return Endless()

    reflector = Reflector(list_pods, "mu-runtime")
    thread = threading.Thread(target=reflector.run, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive() and reflector.lists == 1
