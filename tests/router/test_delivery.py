"""A router's seconds are held until their sink acknowledges them (dataplane.router.delivery):
through a sink that fails, a post answered too late, the memory bound, a spool on disk that a
new router process takes over, and a damaged file. The sink here is a fake that keeps what it
is sent; tests/test_metering_delivery.py runs a real router against a real control plane."""

import asyncio
import json
import os
import stat

import pytest

from dataplane.router.control_plane import ControlPlaneClient
from dataplane.router.delivery import Delivery, SecondRefused, SinkDown, Spool, SpoolBusy, router_id
from dataplane.wire.load_samples import ROUTER_ID, RouterSecond, TrafficSample

ONE = (TrafficSample(7, "acme", requests=1, mu=0.5),)


class Sink:
    """Keeps (router, second, requests) of what it is sent; `fail` says how the next sends fail."""

    def __init__(self) -> None:
        self.got: list[tuple[str, int, int]] = []
        self.fail: str | None = None  # "down": refused; "late": applied, then the answer is lost
        self.malformed: set[int] = set()  # seconds it answers with a 400

    async def send(self, posted: RouterSecond) -> None:
        if self.fail == "down":
            raise ConnectionRefusedError("connection refused")
        if posted.second in self.malformed:
            raise SecondRefused("400: rows[0].requests must be an integer")
        self.got.append((posted.router, posted.second, sum(s.requests for s in posted.samples)))
        if self.fail == "late":
            raise TimeoutError("no answer within 5 s")


def deliver(d: Delivery) -> int:
    return asyncio.run(d.deliver())


def test_a_failing_sink_loses_nothing_and_gets_each_second_oldest_first():
    sink = Sink()
    d = Delivery(sink.send, "router-a", memory_bytes=1 << 20)
    sink.fail = "down"
    for second in (100, 101, 102):
        d.add(ONE, second)
        assert deliver(d) == 0
    assert [h.second for h in d.held] == [100, 101, 102] and sink.got == []
    assert d.down_since is not None
    # Back, but the first answer is lost after the sink applied the second: it stays held and
    # goes again under the same key, which is what lets the sink answer it as a duplicate.
    sink.fail = "late"
    assert deliver(d) == 0 and sink.got == [("router-a", 100, 1)]
    sink.fail = None
    assert deliver(d) == 3
    assert sink.got == [("router-a", s, 1) for s in (100, 100, 101, 102)]
    assert not d.held and d.in_memory == 0 and d.delivered == 3 and d.down_since is None


def test_two_windows_in_one_wall_second_are_two_seconds():
    # A shutdown's last roll in the second of the last tick: the key names one window each.
    sink = Sink()
    d = Delivery(sink.send, "router-a", memory_bytes=1 << 20)
    d.add(ONE, 100)
    d.add(ONE, 100)
    d.add(ONE, 99)  # a clock stepped back
    deliver(d)
    assert [second for _, second, _ in sink.got] == [100, 101, 102]


def test_without_a_spool_the_oldest_go_past_the_memory_bound_counted():
    sink = Sink()
    size = len(json.dumps(RouterSecond(100, ONE, "router-a").to_json()).encode())
    d = Delivery(sink.send, "router-a", memory_bytes=3 * size)
    sink.fail = "down"
    for second in range(100, 105):
        d.add(ONE, second)
    assert [h.second for h in d.held] == [102, 103, 104] and d.in_memory == 3 * size
    assert d.dropped["memory_full"] == 2
    assert 'router_metering_seconds_dropped_total{reason="memory_full"} 2' in d.metrics_text()
    assert "router_metering_seconds_held 3" in d.metrics_text()


def test_the_spool_keeps_what_memory_cannot_and_outlives_the_process(tmp_path):
    sink = Sink()
    spool = Spool(str(tmp_path / "spool"))
    with pytest.raises(SpoolBusy, match="in use by another router process"):
        Spool(str(tmp_path / "spool"))  # a second router on the same directory
    size = len(json.dumps(RouterSecond(100, ONE, "router-a").to_json()).encode())
    d = Delivery(sink.send, "router-a", memory_bytes=2 * size, spool=spool, spool_bytes=1 << 20)
    sink.fail = "down"
    for second in range(100, 105):
        d.add(ONE, second)
    # Two in memory (and on disk), three on disk only; nothing dropped.
    assert [h.body is not None for h in d.held] == [True, True, False, False, False]
    assert (d.in_memory, d.on_disk, sum(d.dropped.values())) == (2 * size, 5 * size, 0)
    files = sorted(os.listdir(tmp_path / "spool"))
    assert files == [*(f"{s:010d}.router-a.json" for s in range(100, 105)), "lock"]
    assert stat.S_IMODE(os.stat(tmp_path / "spool").st_mode) == 0o700
    for name in files:
        assert stat.S_IMODE(os.stat(tmp_path / "spool" / name).st_mode) == 0o600
    # The process ends (or is killed) with them held; the next one takes the directory over
    # and sends them first, each under the id it was metered with, then its own.
    d.close()
    (tmp_path / "spool" / "0000000105.router-a.json.tmp").write_bytes(b'{"rou')  # a kill mid-write
    again = Delivery(sink.send, "router-b", memory_bytes=2 * size, spool=Spool(str(tmp_path / "spool")))
    again.spool_bytes = 1 << 20
    again.add(ONE, 105)
    sink.fail = None
    assert deliver(again) == 6
    assert sink.got == [*(("router-a", s, 1) for s in range(100, 105)), ("router-b", 105, 1)]
    assert os.listdir(tmp_path / "spool") == ["lock"] and again.on_disk == 0


def test_past_the_spool_bound_the_oldest_go(tmp_path):
    sink = Sink()
    size = len(json.dumps(RouterSecond(100, ONE, "router-a").to_json()).encode())
    d = Delivery(sink.send, "router-a", 0, Spool(str(tmp_path)), spool_bytes=2 * size)
    sink.fail = "down"
    for second in range(100, 104):
        d.add(ONE, second)
    assert [h.second for h in d.held] == [102, 103] and d.dropped["spool_full"] == 2
    assert sorted(os.listdir(tmp_path)) == ["0000000102.router-a.json", "0000000103.router-a.json", "lock"]


def test_a_refused_or_damaged_second_is_dropped_and_the_rest_go(tmp_path):
    sink = Sink()
    d = Delivery(sink.send, "router-a", 0, Spool(str(tmp_path)), spool_bytes=1 << 20)
    for second in range(100, 104):
        d.add(ONE, second)
    (tmp_path / "0000000102.router-a.json").write_bytes(b"\x00\x00")  # the disk's doing
    sink.malformed = {101}
    assert deliver(d) == 2
    assert sink.got == [("router-a", 100, 1), ("router-a", 103, 1)]
    assert (d.dropped["refused"], d.dropped["unreadable"]) == (1, 1) and not d.held


def test_a_router_id_is_new_per_process_and_fits_the_wire():
    a, b = router_id(), router_id()
    assert a != b and ROUTER_ID.fullmatch(a) and str(os.getpid()) in a


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(201, None), (200, None), (400, SecondRefused), (413, SecondRefused), (401, SinkDown), (503, SinkDown)],
)
def test_the_control_planes_answer_acknowledges_refuses_or_keeps(status, outcome):
    # 201 stored, 200 a duplicate (stored before): acknowledged. A 400 is the second's fault;
    # a 401 is a key to fix, not a second to give up.
    async def fetch(url, method, headers, body, timeout):
        sent.append(json.loads(body))
        return status, {}, b"{}"

    sent: list[dict] = []
    client = ControlPlaneClient("http://cp", "op-key", fetch, 5.0)
    posted = RouterSecond(100, ONE, "router-a")
    if outcome is None:
        asyncio.run(client.post_samples(posted))
    else:
        with pytest.raises(outcome, match=str(status)):
            asyncio.run(client.post_samples(posted))
    assert sent == [posted.to_json()]


def test_a_clock_put_right_after_running_ahead_takes_a_new_id_not_seconds_ahead_of_it():
    sink = Sink()
    d = Delivery(sink.send, "router-a", memory_bytes=1 << 20)
    d.add(ONE, 100 + 86400)  # a wrong time source a day ahead, then put right
    d.add(ONE, 101)
    d.add(ONE, 102)
    deliver(d)
    (_, ahead, _), (new, first, _), (again, second, _) = sink.got
    assert (ahead, first, second) == (86500, 101, 102)
    assert sink.got[0][0] == "router-a" and new == again != "router-a" and ROUTER_ID.fullmatch(new)


def test_what_the_router_did_not_write_in_its_spool_is_left_alone(tmp_path):
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(RouterSecond(50, ONE, "router-x").to_json()))
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "0000000050.router-x.json").symlink_to(outside)
    (spool / "0000000051.router-x.json").mkdir()
    (spool / "0000000052.router-x.json.tmp").mkdir()
    sink = Sink()
    d = Delivery(sink.send, "router-a", 1 << 20, Spool(str(spool)), spool_bytes=1 << 20)
    d.add(ONE, 100)
    assert deliver(d) == 1 and sink.got == [("router-a", 100, 1)] and not d.held
    assert outside.exists() and (spool / "0000000051.router-x.json").is_dir()


def test_a_spool_file_that_cannot_be_removed_does_not_stop_the_delivery(tmp_path, monkeypatch):
    sink = Sink()
    d = Delivery(sink.send, "router-a", 1 << 20, Spool(str(tmp_path)), spool_bytes=1 << 20)
    d.add(ONE, 100)
    d.add(ONE, 101)

    def read_only(path):  # the disk remounted read-only after errors
        raise OSError(30, "Read-only file system", path)

    monkeypatch.setattr(os, "unlink", read_only)
    assert deliver(d) == 2 and [s for _, s, _ in sink.got] == [100, 101] and not d.held
    monkeypatch.undo()
    d.close()
    # Started again on the directory: both go again, for the sink to answer as duplicates.
    again = Delivery(sink.send, "router-b", 1 << 20, Spool(str(tmp_path)), spool_bytes=1 << 20)
    assert [(h.router, h.second) for h in again.held] == [("router-a", 100), ("router-a", 101)]


def test_a_spool_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    # Made before the router by someone else (in a directory others can write to): its owner
    # could put seconds there for the router to send as its own.
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(tmp_path).st_uid + 1)
    with pytest.raises(PermissionError, match="belongs to uid"):
        Spool(str(tmp_path))
